"""A thin wrapper over an onnxruntime session of a decoder exported with past key/values.

It reads the graph's own input/output names and shapes (layers, kv heads, head dim, dtype) so the backend can build
past key/values, attention masks and position ids itself; optimum's ORTModel hides the cache, which we need to share.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fastscore.deps import require
from fastscore.errors import ArtefactUnavailableError, UnsupportedError

log = logging.getLogger(__name__)

LOGITS_START = "logits_start"  # optional input added by fastscore.conversion.hf_to_onnx
_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)$")
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def find_model_file(folder: Path) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtefactUnavailableError(f"ONNX model folder {folder} does not exist")
    if (folder / "model.onnx").is_file():
        return folder / "model.onnx"
    candidates = sorted(folder.glob("*.onnx"))
    if len(candidates) != 1:
        raise ArtefactUnavailableError(f"expected one .onnx file in {folder}, found {[p.name for p in candidates]}")
    return candidates[0]


class DecoderSession:
    """Runs the graph on numpy inputs; past is a list of 2 * n_layers arrays: layer 0 key, layer 0 value, ..."""

    def __init__(self, folder: Path, n_threads: int | None = None) -> None:
        ort = require("onnxruntime", "onnx")
        self.folder = Path(folder)
        model_file = find_model_file(self.folder)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.inter_op_num_threads = 1
        if n_threads:
            options.intra_op_num_threads = int(n_threads)
        # Idle pool threads would otherwise busy-wait after each run, starving torch or a second session on 2 cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # the overridable `logits_start` initializer triggers a harmless warning
        log.info("loading ONNX session %s (threads=%s)", model_file, n_threads or "auto")
        self.session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
        self._read_signature()
        self._read_config()

    def _read_signature(self) -> None:
        inputs = {i.name: i for i in self.session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - set(inputs)
        if missing:
            raise UnsupportedError(f"{self.folder}: ONNX graph lacks inputs {sorted(missing)}")
        past = sorted(
            ((int(m.group(1)), m.group(2), name) for name in inputs if (m := _PAST.match(name))),
            key=lambda item: (item[0], item[1] != "key"),
        )
        if not past:
            raise UnsupportedError(f"{self.folder}: ONNX graph has no past_key_values inputs (export 'with past')")
        self.past_names = [name for _, _, name in past]
        self.present_names = [name.replace("past_key_values", "present") for name in self.past_names]
        self.n_layers = len(past) // 2
        first = inputs[self.past_names[0]]
        _, self.n_kv_heads, _, self.head_dim = first.shape
        if not (isinstance(self.n_kv_heads, int) and isinstance(self.head_dim, int)):
            raise UnsupportedError(f"{self.folder}: past key/value heads and head dim must be static: {first.shape}")
        self.kv_dtype = _ORT_DTYPES.get(first.type)
        if self.kv_dtype is None:
            raise UnsupportedError(f"{self.folder}: unsupported past key/value type {first.type}")
        self.has_position_ids = "position_ids" in inputs
        overridable = {i.name for i in self.session.get_overridable_initializers()}
        self.has_logits_start = LOGITS_START in overridable or LOGITS_START in inputs
        outputs = {o.name: o for o in self.session.get_outputs()}
        vocab = outputs["logits"].shape[-1]
        self._graph_vocab = vocab if isinstance(vocab, int) else None

    def _read_config(self) -> None:
        config_file = self.folder / "config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        self.n_ctx = int(config.get("max_position_embeddings") or 2**31 - 1)
        self.n_vocab = self._graph_vocab or int(config["vocab_size"])
        self.config = config

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of past key/values one token occupies in one sequence."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * np.dtype(self.kv_dtype).itemsize

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.n_kv_heads, 0, self.head_dim)
        return [np.zeros(shape, dtype=self.kv_dtype) for _ in self.past_names]

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: Sequence[np.ndarray] | None = None,
        logits_start: int = 0,
        want_present: bool = True,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One forward pass. Returns (logits of positions >= logits_start [B, S - start, V], present key/values).

        want_present=False skips copying the present key/values out of the session (returns an empty list).
        """
        batch = input_ids.shape[0]
        feeds = {
            "input_ids": np.ascontiguousarray(input_ids, dtype=np.int64),
            "attention_mask": np.ascontiguousarray(attention_mask, dtype=np.int64),
        }
        if self.has_position_ids:
            feeds["position_ids"] = np.ascontiguousarray(position_ids, dtype=np.int64)
        past = self.empty_past(batch) if past is None else past
        feeds.update(zip(self.past_names, past))
        if self.has_logits_start and logits_start:
            feeds[LOGITS_START] = np.array([logits_start], dtype=np.int64)
        outputs = self.session.run(["logits", *(self.present_names if want_present else ())], feeds)
        logits = outputs[0]
        if not self.has_logits_start and logits_start:
            logits = logits[:, logits_start:]  # the graph computed every row; keep the ones asked for
        return logits, outputs[1:]

    def run_sequence(
        self, tokens: Sequence[int], logits_start: int, past: Sequence[np.ndarray] | None = None, past_len: int = 0
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Feed one sequence (batch 1) after `past_len` tokens of past; logits [S - logits_start, V]."""
        ids = np.asarray(tokens, dtype=np.int64)[None]
        seq = ids.shape[1]
        mask = np.ones((1, past_len + seq), dtype=np.int64)
        positions = np.arange(past_len, past_len + seq, dtype=np.int64)[None]
        logits, present = self.run(ids, mask, positions, past, logits_start=logits_start)
        return logits[0], present
