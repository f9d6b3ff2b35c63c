"""HF checkpoint folder -> ONNX decoder with past key/values (fp32 via optimum, int8 weights from the fp32 graph).

The exported graph gets one extra, optional input, `logits_start` (an overridable initializer defaulting to 0): the
lm-head runs only on positions >= logits_start. The scorer needs a single logits row from a long shared prefix, and the
lm-head is a fifth of a small model's compute, so skipping it there matters. Consumers that do not feed the input
(e.g. optimum's ORTModelForCausalLM) get every position, as from a plain export.

Every output is read back and checked against the torch model before the caller renames it into place.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import shutil
import tempfile
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from fastscore.deps import require
from fastscore.errors import ArtefactUnavailableError, ConversionCheckError, ConversionError
from fastscore.mathops import log_softmax_rows
from fastscore.variants import quants

log = logging.getLogger(__name__)

QUANTS = quants("onnx")
INT8_METHODS = ("weights", "dynamic")
MODEL_FILE = "model.onnx"
# optimum's name for the weights file past the protobuf limit; every fp32 export keeps its weights there.
EXTERNAL_DATA = "model.onnx_data"
LOGITS_START = "logits_start"
# Files copied from the HF folder next to the ONNX graph, so the folder is self-contained for tokenization.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt")
# The fp32 export must match torch to this (nats, per log-prob) on the check sequence.
FP32_CHECK_TOL = 1e-3
# int8 is only checked for sanity: log-probs of the check sequence must correlate with torch's this well.
INT8_CHECK_MIN_CORR = 0.9
# ONNX protobufs are limited to 2 GB; larger models keep their weights in an external data file.
_PROTOBUF_LIMIT = 2_000_000_000
# Initializers up to this size (bytes) stay in the graph file, e.g. the overridable logits_start.
_EXTERNAL_THRESHOLD = 1024
# Weights per int8 scale in the weight-only quantisation.
INT8_BLOCK = 32


def export_onnx(
    hf_dir: Path, out_dir: Path, quant: str, *, fp32_dir: Path | None = None, int8_method: str = "weights"
) -> Path:
    """Export the HF folder `hf_dir` into `out_dir` (a scratch folder the caller renames); returns `out_dir`.

    quant "fp32": optimum export (task text-generation-with-past). quant "int8": int8 weights from the fp32 export
    (an existing one can be passed as `fp32_dir`). int8_method "weights" (default): every linear layer's weight
    int8 with one scale per 32 weights (see quantize_weights_int8). "dynamic": onnxruntime's quantize_dynamic,
    whose per-tensor activation scale couples all rows of a forward pass, so scores depend on what is batched
    together (measured on SmolLM2-135M: up to 6 nats per token between one pass and two halves, so prefix sharing
    is not exact) and its mean error vs fp32 is ~15x that of "weights".
    """
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    if quant not in QUANTS:
        raise ConversionError(f"unknown ONNX quant {quant!r}; known: {', '.join(QUANTS)}")
    if int8_method not in INT8_METHODS:
        raise ConversionError(f"unknown int8 method {int8_method!r}; known: {', '.join(INT8_METHODS)}")
    if not (hf_dir / "config.json").is_file():
        raise ArtefactUnavailableError(f"no HF checkpoint (config.json) in {hf_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if quant == "fp32":
        _export_fp32(hf_dir, out_dir)
    elif fp32_dir is not None:
        _quantize_int8(Path(fp32_dir), out_dir, int8_method)
    else:
        with tempfile.TemporaryDirectory(prefix=".fp32-", dir=out_dir.parent) as tmp:
            _export_fp32(hf_dir, Path(tmp))
            _quantize_int8(Path(tmp), out_dir, int8_method)
    _copy_side_files(hf_dir, out_dir)
    log.info("exported %s to ONNX %s in %.1f s", hf_dir, quant, time.perf_counter() - started)
    check_export(out_dir, hf_dir, quant, past_must_match=quant == "fp32" or int8_method == "weights")
    return out_dir


def _export_fp32(hf_dir: Path, out_dir: Path) -> None:
    """optimum's export and add_logits_start, in a fresh process that exits before the read-back check.

    The export's memory is torch's: the model, its constant-folded weights and, under the protobuf limit, the whole
    graph serialised and re-parsed in memory (measured on the 360M stand-in, 1.45 GB of weights: 6.8 GB peak RSS).
    In-process, the allocator kept much of it and the steps after the export peaked at 4.8-5.5 GB; in the caller,
    now that a child process does the export and returns all of it at exit, they peak at 3.2 GB.
    """
    require("onnxruntime", "onnx")
    require("optimum.exporters.onnx", "onnx", package="optimum-onnx")
    # optimum's post-processing (deduplicating tied weights) fails on graphs past the protobuf limit (measured on
    # the Qwen3-0.6B stand-in, 2.4 GB): large models are exported without it and keep the lm-head as its own copy.
    large = _total_size(hf_dir) > _PROTOBUF_LIMIT
    # spawn, not fork: a forked child would share (and copy on write) whatever the caller already holds.
    context = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            pool.submit(_export_fp32_here, str(hf_dir), str(out_dir), large).result()
    except BrokenProcessPool as exc:  # killed, e.g. by the kernel's OOM killer
        raise ConversionError(f"the ONNX export process of {hf_dir} died (out of memory?): {exc}") from exc


def _export_fp32_here(hf_dir: str, out_dir: str, large: bool) -> None:
    main_export = require("optimum.exporters.onnx", "onnx", package="optimum-onnx").main_export
    log.info("exporting %s with optimum (text-generation-with-past%s)", hf_dir, ", no post-processing" if large else "")
    try:
        main_export(
            hf_dir, out_dir, task="text-generation-with-past", device="cpu", dtype="fp32",
            local_files_only=True, do_validation=False, library_name="transformers", no_post_process=large,
        )
    except Exception as exc:  # optimum raises bare ValueError/RuntimeError for unsupported architectures
        raise ConversionError(f"optimum could not export {hf_dir}: {exc}") from exc
    if not (Path(out_dir) / MODEL_FILE).is_file():
        raise ConversionError(f"optimum wrote no {MODEL_FILE} in {out_dir}")
    add_logits_start(Path(out_dir) / MODEL_FILE)


def add_logits_start(model_path: Path) -> bool:
    """Insert Slice(hidden, logits_start:) before the lm-head MatMul. False if the graph is not shaped as expected.

    The graph is saved with its weights in EXTERNAL_DATA (past the protobuf limit optimum already put them there):
    saving writes them tensor by tensor instead of serialising a second copy of the whole model, and every later
    reader (the structure check, the int8 quantiser, onnxruntime) can read the graph without them.
    """
    onnx = require("onnx", "onnx")
    model = onnx.load(str(model_path), load_external_data=False)  # external weights stay in their file, untouched
    graph = model.graph
    # Weights are either all in the graph (under the limit) or all in optimum's data file (past it).
    inline = (not any(init.data_location == onnx.TensorProto.EXTERNAL for init in graph.initializer)
              and any(len(init.raw_data) > _EXTERNAL_THRESHOLD for init in graph.initializer))
    had_input = any(i.name == LOGITS_START for i in graph.input)
    has_input = had_input or _slice_before_lm_head(onnx, graph, model_path)
    if inline:
        _save(model, model_path)  # the weights move out, whether or not the graph changed
    elif has_input and not had_input:
        onnx.save(model, str(model_path))  # the weights' external references are kept as they are
    return has_input


def _slice_before_lm_head(onnx, graph, model_path: Path) -> bool:
    """Insert the Slice and the logits_start input into `graph`; False (graph untouched) if the lm-head is not a
    single MatMul producing "logits"."""
    numpy_helper, helper = onnx.numpy_helper, onnx.helper
    producers = [n for n in graph.node if "logits" in n.output]
    if len(producers) != 1 or producers[0].op_type != "MatMul":
        log.warning("lm-head of %s is not a single MatMul; logits stay computed at every position", model_path)
        return False
    lm_head = producers[0]
    int64 = np.int64
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0], dtype=int64), LOGITS_START),
        numpy_helper.from_array(np.array([np.iinfo(int64).max], dtype=int64), "logits_slice_end"),
        numpy_helper.from_array(np.array([1], dtype=int64), "logits_slice_axis"),
    ])
    graph.input.append(helper.make_tensor_value_info(LOGITS_START, onnx.TensorProto.INT64, [1]))
    slice_node = helper.make_node(
        "Slice", [lm_head.input[0], LOGITS_START, "logits_slice_end", "logits_slice_axis"],
        ["logits_rows_hidden"], name="fastscore_slice_logits_rows",
    )
    graph.node.insert(list(graph.node).index(lm_head), slice_node)
    lm_head.input[0] = "logits_rows_hidden"
    return True


def _save(model, model_path: Path) -> None:
    """Save with every initializer above _EXTERNAL_THRESHOLD bytes in EXTERNAL_DATA next to `model_path`."""
    onnx = require("onnx", "onnx")
    data = Path(model_path).with_name(EXTERNAL_DATA)
    if data.exists():
        data.unlink()  # onnx appends to an existing data file
    onnx.save(model, str(model_path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=EXTERNAL_DATA, size_threshold=_EXTERNAL_THRESHOLD)


def _quantize_int8(fp32_dir: Path, out_dir: Path, method: str) -> None:
    source = fp32_dir / MODEL_FILE
    if not source.is_file():
        raise ConversionError(f"no fp32 export ({MODEL_FILE}) in {fp32_dir}")
    if method == "dynamic":
        quantization = require("onnxruntime.quantization", "onnx")
        log.info("quantising %s to int8 (quantize_dynamic, per-channel weights)", source)
        quantization.quantize_dynamic(
            source, out_dir / MODEL_FILE, weight_type=quantization.QuantType.QInt8, per_channel=True,
            use_external_data_format=_total_size(fp32_dir) > _PROTOBUF_LIMIT,
        )
    else:
        quantize_weights_int8(source, out_dir / MODEL_FILE)
    for name in SIDE_FILES:
        if (fp32_dir / name).is_file():
            shutil.copy2(fp32_dir / name, out_dir / name)


def quantize_weights_int8(source: Path, target: Path, block_size: int = INT8_BLOCK) -> int:
    """Store every MatMul's constant fp32 weight as int8 with one scale per `block_size` weights (symmetric).

    Standard ONNX: int8 initializer -> blocked DequantizeLinear (opset 21) -> MatMul. onnxruntime fuses the pair
    into one MatMulNBits kernel (8 bits) at load time, which quantises activations per block of a single row, so a
    row's numbers do not depend on what else is in the forward pass. Returns the number of MatMuls quantised.
    """
    onnx = require("onnx", "onnx")
    numpy_helper, helper = onnx.numpy_helper, onnx.helper
    model = onnx.load(str(source))
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    # A tied lm-head reads the embedding through a Transpose node; its weight is quantised the same way.
    transposed = {n.output[0]: n.input[0] for n in graph.node
                  if n.op_type == "Transpose" and n.input[0] in initializers}
    nodes, replaced = [], set()
    for node in graph.node:
        array = _constant_weight(node, initializers, transposed, numpy_helper)
        if array is None or array.ndim != 2 or array.dtype != np.float32 or array.shape[0] % block_size:
            nodes.append(node)
            continue
        k, n = array.shape
        blocks = array.reshape(k // block_size, block_size, n)
        scales = np.abs(blocks).max(axis=1) / 127.0
        scales[scales == 0] = 1.0
        quantised = np.clip(np.rint(blocks / scales[:, None]), -127, 127).astype(np.int8).reshape(k, n)
        weight = node.input[1]
        q_name, s_name, dq_name = f"{weight}_int8", f"{weight}_int8_scales", f"{weight}_dequantized"
        graph.initializer.extend([numpy_helper.from_array(quantised, q_name),
                                  numpy_helper.from_array(scales.astype(np.float32), s_name)])
        nodes.append(helper.make_node("DequantizeLinear", [q_name, s_name], [dq_name], name=f"{node.name}_dq",
                                      axis=0, block_size=block_size))
        node.input[1] = dq_name
        nodes.append(node)
        replaced.add(weight)
    # Drop what only fed the quantised weights: the fp32 initializers and a tied lm-head's Transpose.
    read = {name for node in nodes for name in node.input}
    nodes = [node for node in nodes if not (node.output[0] in replaced and node.output[0] not in read)]
    read = {name for node in nodes for name in node.input}
    sources = replaced | {transposed[name] for name in replaced if name in transposed}
    remaining = [init for init in graph.initializer if init.name in read or init.name not in sources]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(remaining)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < 21:
            opset.version = 21  # blocked DequantizeLinear; the exporter's other ops keep their meaning up to 21
    external = sum(init.ByteSize() for init in graph.initializer) > _PROTOBUF_LIMIT
    onnx.save(model, str(target), save_as_external_data=external, location=f"{Path(target).name}_data")
    log.info("int8 weights: quantised %d MatMuls (block %d)", len(replaced), block_size)
    return len(replaced)


def _constant_weight(node, initializers: dict, transposed: dict, numpy_helper) -> np.ndarray | None:
    """The MatMul's right operand if it is a constant (an initializer, or a Transpose of one), else None."""
    if node.op_type != "MatMul":
        return None
    name = node.input[1]
    if name in initializers:
        return numpy_helper.to_array(initializers[name])
    if name in transposed:
        return numpy_helper.to_array(initializers[transposed[name]]).T
    return None


def _total_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _copy_side_files(hf_dir: Path, out_dir: Path) -> None:
    for name in SIDE_FILES:
        if (hf_dir / name).is_file() and not (out_dir / name).is_file():
            shutil.copy2(hf_dir / name, out_dir / name)


def check_export(
    onnx_dir: Path, hf_dir: Path, quant: str, past_must_match: bool = True, n_tokens: int = 24, seed: int = 0
) -> dict:
    """Read the export back: it must track torch, and scoring in two halves (with past) must equal one pass.

    Raises ConversionCheckError; returns the measured differences {"max_abs_diff", "corr", "past_vs_full"} (nats).
    """
    torch = require("torch", "onnx")
    transformers = require("transformers", "onnx")
    from fastscore.backends.onnx_session import DecoderSession

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, local_files_only=True)
    n_vocab = int(model.config.vocab_size)
    tokens = np.random.default_rng(seed).integers(0, n_vocab, size=n_tokens)
    with torch.inference_mode():
        logits = model.eval()(torch.as_tensor(tokens[None])).logits[0].double()
    want = torch.log_softmax(logits, dim=-1).numpy()
    del model

    session = DecoderSession(onnx_dir)
    full = log_softmax_rows(session.run_sequence(tokens, 0)[0])
    half = n_tokens // 2
    head, past = session.run_sequence(tokens[:half], 0)
    tail, _ = session.run_sequence(tokens[half:], 0, past, past_len=half)
    split = log_softmax_rows(np.concatenate([head, tail]))
    if not (np.isfinite(full).all() and np.isfinite(split).all()):
        raise ConversionCheckError(f"the {quant} ONNX export in {onnx_dir} produced non-finite log-probs")
    measured = {
        "max_abs_diff": float(np.abs(full - want).max()),
        "corr": float(np.corrcoef(full.ravel(), want.ravel())[0, 1]),
        "past_vs_full": float(np.abs(full - split).max()),
    }
    log.info("ONNX %s check: %s", quant, measured)
    # quantize_dynamic's activation scale spans the whole forward pass, so its halves cannot match one pass.
    if past_must_match and measured["past_vs_full"] > FP32_CHECK_TOL:
        raise ConversionCheckError(f"ONNX export {onnx_dir}: scoring with past differs from without: {measured}")
    if quant == "fp32" and measured["max_abs_diff"] > FP32_CHECK_TOL:
        raise ConversionCheckError(f"fp32 ONNX export {onnx_dir} differs from torch: {measured}")
    if quant == "int8" and measured["corr"] < INT8_CHECK_MIN_CORR:
        raise ConversionCheckError(f"int8 ONNX export {onnx_dir} does not track torch: {measured}")
    return measured

