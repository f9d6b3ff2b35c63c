"""What produced a scores file: the sidecar OUT.meta.json written next to every `score` output.

It names the fastscore version, the model, backend, quant and weights (with the weights note), the settings that
decide exactness (backend options such as the KV-cache type, the context size, whether the end-of-turn token is
scored), a hash of the tokenizer, the library versions, the command and the time, and how far the scores may move
with the batching (the tolerance and what was measured for the backend and type: docs/exactness.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastscore import variants
from fastscore.backends.options import ARITHMETIC_OPTIONS
from fastscore.version import __version__

META_SUFFIX = ".meta.json"
LIBRARIES = ("llama-cpp-python", "onnxruntime", "torch", "transformers", "tokenizers", "jinja2", "numpy")
# How fastscore.variants' batch_max_diff values were measured.
BATCH_MEASUREMENT = ("max |log-prob change| per token over chunk sizes 1, 2, 3, 8, 17, 64, one trie group per request "
                     "and micro-batches of 32, SmolLM2-135M on examples/tool_calls.jsonl (tests/test_exact_default.py)")


def meta_path(out: Path) -> Path:
    return out.with_name(out.name + META_SUFFIX)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def tokenizer_sha256(tokenizer) -> str | None:
    """SHA-256 of the tokenizer.json the scores were tokenized with (None for a tokenizer not read from a folder)."""
    path = Path(tokenizer.name) / "tokenizer.json" if tokenizer.name else None
    if path is None or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def versions() -> dict[str, Any]:
    """The fastscore, Python and library versions of this process (None for a library not installed)."""
    return {"fastscore_version": __version__, "python": platform.python_version(),
            "libraries": {name: _version(name) for name in LIBRARIES}}


def weights_record(scorer) -> dict[str, str]:
    """The weights file a scorer computes with and its note (e.g. a quantisation caveat); where llama.cpp computes
    the f32 weights from their compact file (fastscore.backends.llamacpp_compact), that file too."""
    record = {"weights": str(scorer.backend.path), "weights_note": scorer.weights_note}
    computed_from = getattr(scorer.backend, "weights_file", scorer.backend.path)
    if computed_from != scorer.backend.path:
        record["weights_computed_from"] = f"{computed_from} (the same f32 values, decoded in each product)"
    return record


def produced_by(scorer) -> dict[str, Any]:
    """What a study's config.json records about the run that produced it: versions, weights and note, time."""
    return {**versions(), **weights_record(scorer), "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def versions_markdown(records: list[dict[str, Any]]) -> str:
    """A report section: one column per record (the run that started, then any resume under other versions)."""
    if not records:
        return "## Versions\n\nNot recorded (a folder written before fastscore recorded versions)."
    heads = ["started"] + [f"resumed ({r.get('created', '?')})" for r in records[1:]]
    rows = [("fastscore", [r.get("fastscore_version") for r in records]),
            ("python", [r.get("python") for r in records]),
            *((name, [r.get("libraries", {}).get(name) for r in records]) for name in LIBRARIES),
            ("weights", [r.get("weights") for r in records]),
            ("weights note", [r.get("weights_note") for r in records])]
    lines = ["| | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join("not installed" if v is None else str(v) for v in values) + " |"
              for label, values in rows]
    return "## Versions\n\n" + "\n".join(lines)


def batch_invariance(backend: str, quant: str, backend_options=None) -> dict[str, Any]:
    """Whether scores of (backend, quant) depend on how requests are batched: True, False, or None where it was not
    measured (the type, or backend options other than the defaults it was measured with); with the tolerance, the
    measured value and a note."""
    measured = variants.get(backend, quant).batch_max_diff
    tol = variants.BATCH_INVARIANCE_TOL
    changed = _non_default(backend_options)
    if measured is not None and changed:
        measured = None
        what = f"with {', '.join(changed)}"
    else:
        what = f"for {backend} {quant}"
    if backend == "reference":
        dependent, note = False, "each request runs alone in its own forward pass: nothing is batched"
    elif measured is None:
        dependent, note = None, f"batch dependence not measured {what}"
    else:
        dependent = measured > tol
        note = (f"measured max {measured:.2g} nats/token between batchings ({BATCH_MEASUREMENT}); "
                f"tolerance {tol:g}" + ("; scores depend on the batching: compare runs batched alike"
                                        if dependent else ""))
    return {"batch_dependent": dependent, "batch_tolerance": tol, "batch_max_abs_diff_measured": measured,
            "note": note}


def _non_default(backend_options) -> list[str]:
    """The options (key=value) of a record that change the scoring arithmetic and differ from their defaults (the
    settings the batch dependence was measured with); options that only lay out the batch do not count."""
    if not dataclasses.is_dataclass(backend_options):
        return []
    default = type(backend_options)()
    return [f"{name}={getattr(backend_options, name)}" for name in ARITHMETIC_OPTIONS
            if getattr(backend_options, name, None) != getattr(default, name, None)]


def run_metadata(scorer, *, model: str, backend: str, quant: str, backend_options=None, command: str = "",
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metadata of scores produced by `scorer` (a fastscore.scorer.Scorer)."""
    options = dataclasses.asdict(backend_options) if dataclasses.is_dataclass(backend_options) else {}
    found = versions()
    return {
        "fastscore_version": found["fastscore_version"],
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "model": model,
        "backend": backend,
        "quant": quant,
        **weights_record(scorer),
        "exactness": {
            "backend_options": options,
            "n_ctx": scorer.backend.n_ctx,
            "threads": scorer.backend.n_threads,
            "include_end_of_turn": scorer.include_end_of_turn,
            **batch_invariance(backend, quant, backend_options),
        },
        "top_k": scorer.top_k,
        "tokenizer": {"path": scorer.tokenizer.name, "sha256": tokenizer_sha256(scorer.tokenizer),
                      "chat_template_sha256": hashlib.sha256(scorer.tokenizer.chat_template.encode()).hexdigest()
                      if scorer.tokenizer.chat_template else None},
        "libraries": found["libraries"],
        "python": found["python"],
        **(extra or {}),
    }
