"""`fastscore models verify`: hash every file of a model's cached variants (and its shipped GGUF) against the record
written when each was built (fastscore.cache), and name the command that rebuilds whatever is damaged."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastscore import cache as artefact_cache
from fastscore.conversion.pipeline import repair_command
from fastscore.errors import ArtefactUnavailableError
from fastscore.resolve import model_source


@dataclass(frozen=True)
class VerifyResult:
    model: str
    variant: str
    path: Path
    problems: tuple[str, ...]  # empty: intact
    fix: str
    note: str = ""  # e.g. built by other versions: not damaged, rebuilt on next use

    def line(self) -> str:
        state = "; ".join(self.problems) if self.problems else (self.note or "ok")
        fix = f" -> fix: {self.fix}" if self.problems else ""
        return f"{self.model:<24} {self.variant:<16} {state}{fix}"


def verify(model: str, hf_path: Path | None = None) -> list[VerifyResult]:
    """Hash every file of every cached variant of `model` (and the shipped GGUF) against what was recorded."""
    from fastscore.embedded import check_shipped, reinstall_command

    source = model_source(model, hf_path)
    results = []
    if source.embedded_gguf is not None:
        try:
            check_shipped(source.entry, source.embedded_gguf)
            problems: tuple[str, ...] = ()
        except ArtefactUnavailableError as exc:
            problems = (str(exc),)
        results.append(VerifyResult(source.name, f"gguf-{source.entry.embedded.quant} (shipped)",
                                    source.embedded_gguf, problems, reinstall_command(source.entry)))
    folder = artefact_cache.home() / source.key
    variants = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if folder.is_dir() else []
    for path in variants:
        stale = artefact_cache.stale_reason(path)
        if stale == "missing":
            continue
        recorded = artefact_cache.read_marker(path) is not None  # older markers record no files
        found = tuple(map(str, artefact_cache.check_files(path, full=True))) if recorded else ()
        note = f"ok, but stale: {stale} (rebuilt on next use)" if stale is not None else ""
        results.append(VerifyResult(source.name, path.name, path, found, repair_command(source, path.name), note))
    return results
