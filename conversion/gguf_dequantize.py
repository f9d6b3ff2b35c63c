"""A quantized GGUF -> the same model as an all-F32 GGUF, in numpy (gguf-py): no torch, no transformers, no converter.

Every tensor is dequantized with gguf-py's reference dequantizers (`gguf.quants.dequantize`, which decode the blocks
as ggml's own dequantize_row_* does) and written as F32; every metadata key is copied byte for byte (the vocabulary,
merges and chat template stay the file's own: rebuilding them is where tokenizers go wrong), except the file type,
which becomes ALL_F32. The file is streamed tensor by tensor, so memory stays near one tensor's f32 size.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from fastscore.deps import require
from fastscore.errors import ConversionCheckError, ConversionError

log = logging.getLogger(__name__)

# Keys the writer sets itself (the architecture; the data alignment, its default) or that change (the file type).
_WRITER_KEYS = ("general.architecture", "general.alignment", "general.file_type")


def _value(field, gguf) -> tuple[Any, Any, Any]:
    """(value, type, array item type) of a metadata field as read; strings stay bytes (copied exactly)."""
    kind = field.types[0]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]), kind, None
    if kind != gguf.GGUFValueType.ARRAY:
        return field.contents(), kind, None
    if len(field.types) != 2:
        raise ConversionError(f"metadata key {field.name!r} is a nested array, which this copy does not handle")
    item = field.types[1]
    if item == gguf.GGUFValueType.STRING:
        return [bytes(field.parts[i]) for i in field.data], kind, item
    return field.contents(), kind, item


def _architecture(reader) -> str:
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ConversionError("the GGUF names no architecture (general.architecture)")
    return bytes(field.parts[field.data[0]]).decode()


def dequantize_tensor(tensor, gguf) -> np.ndarray:
    """A reader tensor's values as float32, in numpy's (row-major) shape: rows x the innermost dimension."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the innermost dimension first
    return np.ascontiguousarray(values, dtype=np.float32).reshape(shape)


def dequantize_gguf(src: Path, dst: Path, *, progress: bool = True) -> Path:
    """Write `src` with every tensor dequantized to F32 into `dst` (a new file; the caller makes it atomic)."""
    gguf = require("gguf", "tokenizer")
    src, dst = Path(src), Path(dst)
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), _architecture(reader))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in _WRITER_KEYS:
            continue
        value, kind, item = _value(field, gguf)
        if kind == gguf.GGUFValueType.ARRAY and len(value) == 0:
            log.warning("dropping the empty metadata array %r (GGUF cannot write one)", field.name)
            continue
        writer.add_key_value(field.name, value, kind, sub_type=item)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))
        writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32), 4 * int(tensor.n_elements))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    bar = tqdm(reader.tensors, desc="dequantizing to f32", unit="tensor", disable=not progress, leave=False,
               file=sys.stderr)
    try:
        for tensor in bar:
            writer.write_tensor_data(dequantize_tensor(tensor, gguf))
    finally:
        bar.close()
        writer.close()
    log.info("dequantized %s (%d tensors) to %s", src.name, len(reader.tensors), dst)
    return dst


def check_dequantized(src: Path, dst: Path) -> str:
    """Read `dst` back: the same tensors (names, shapes) as `src`, all F32, each equal to `src`'s dequantized values
    bit for bit, and the same metadata apart from the file type. Returns a one-line summary."""
    gguf = require("gguf", "tokenizer")
    source, written = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(dst))
    problems = []
    if [t.name for t in source.tensors] != [t.name for t in written.tensors]:
        problems.append("the tensor names or their order differ from the source's")
    for a, b in zip(source.tensors, written.tensors):
        if b.tensor_type != gguf.GGMLQuantizationType.F32:
            problems.append(f"{b.name} is {b.tensor_type.name}, not F32")
        elif list(a.shape) != list(b.shape):
            problems.append(f"{b.name} has shape {list(b.shape)}, the source {list(a.shape)}")
        elif not np.array_equal(dequantize_tensor(a, gguf), dequantize_tensor(b, gguf)):
            problems.append(f"{b.name} differs from the source's dequantized values")
    for name, field in source.fields.items():
        if name.startswith("GGUF.") or name in _WRITER_KEYS:
            continue
        other = written.fields.get(name)
        if other is None or _value(field, gguf)[0] != _value(other, gguf)[0]:
            problems.append(f"metadata {name!r} was not copied exactly")
    if problems:
        raise ConversionCheckError(f"the f32 GGUF {dst} is not the dequantized {src.name}: " + "; ".join(problems[:5]))
    return f"{len(written.tensors)} tensors: all F32, each equal to the dequantized source; metadata copied"
