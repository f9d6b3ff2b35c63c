"""The compute limit: the machine's measured sgemm rate, and a model's FLOPs per token from its shape.

FLOPs per token = 2 x (matmul parameters outside the embedding) + attention. The attention term is the two
score/value products of each layer: at 0-based position t a query attends to t + 1 keys, costing
2 x (t + 1) x n_head x head_dim for QK^T and as much again for AV, so 4 x n_layer x n_head x head_dim x (t + 1).
The output projection (lm_head, d_model x n_vocab) is counted separately: an engine that skips it at positions
scoring nothing pays it only on the rows it keeps.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that set a decoder-only transformer's compute (grouped-query attention, gated MLP)."""

    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    n_vocab: int
    source: str = ""  # where the numbers came from (GGUF metadata keys or config.json)

    def to_dict(self) -> dict:
        return asdict(self)


WEIGHTS = ("q", "k", "v", "o", "gate", "up", "down")  # the matmul weights of one layer, in graph order


def layer_weight_params(shape: ModelShape) -> dict[str, int]:
    """Weights of each matmul of one layer (keys: WEIGHTS): the q, k, v, o projections (grouped-query attention: k
    and v are n_kv_head heads wide, q and o n_head) and the gated MLP's gate, up and down."""
    d, d_ff = shape.d_model, shape.d_ff
    q_width, kv_width = shape.n_head * shape.head_dim, shape.n_kv_head * shape.head_dim
    return {"q": d * q_width, "k": d * kv_width, "v": d * kv_width, "o": q_width * d,
            "gate": d * d_ff, "up": d * d_ff, "down": d_ff * d}


def layer_matmul_params(shape: ModelShape) -> int:
    """Weights multiplied per token in one layer: q, k, v, o projections and the gated MLP (gate, up, down)."""
    return sum(layer_weight_params(shape).values())


def non_embedding_params(shape: ModelShape) -> int:
    """Matmul parameters of all layers (norm gains are elementwise, not matmuls, and are left out)."""
    return shape.n_layer * layer_matmul_params(shape)


def lm_head_flops(shape: ModelShape) -> int:
    return 2 * shape.d_model * shape.n_vocab


def attention_cell_flops(shape: ModelShape) -> float:
    """Attention FLOPs of one query attending one key, every layer: QK^T and AV, 2 x n_head x head_dim each."""
    return 4.0 * shape.n_layer * shape.n_head * shape.head_dim


def attention_flops(shape: ModelShape, positions: np.ndarray | Sequence[int]) -> np.ndarray:
    """Attention FLOPs of a token at each 0-based position (QK^T and AV over t + 1 keys, every layer)."""
    t = np.asarray(positions, dtype=np.float64)
    return attention_cell_flops(shape) * (t + 1.0)


def flops_per_token(shape: ModelShape, mean_position: float, with_lm_head: bool) -> float:
    """2 x non-embedding params + attention at the mean position (+ the lm_head when it runs at every token)."""
    flops = 2.0 * non_embedding_params(shape) + float(attention_flops(shape, [mean_position])[0])
    return flops + (lm_head_flops(shape) if with_lm_head else 0.0)


def workload_flops(shape: ModelShape, computed_tokens: int, mean_position: float, lm_head_rows: int) -> float:
    """FLOPs of `computed_tokens` forward positions with the lm_head run on `lm_head_rows` of them only."""
    return computed_tokens * flops_per_token(shape, mean_position, with_lm_head=False) + lm_head_rows * lm_head_flops(shape)


def gflops(flops: float, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0 (got {seconds})")
    return flops / seconds / 1e9


def median(values: Iterable[float]) -> float:
    values = list(values)
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, None when the denominator is 0 (reported as 'n/a', never as a number)."""
    return None if denominator == 0 else float(numerator) / float(denominator)


# ---------------------------------------------------------------- reading a shape


def shape_from_gguf(path: Path) -> ModelShape:
    """From GGUF metadata: {arch}.block_count, .embedding_length, .feed_forward_length, .attention.head_count,
    .attention.head_count_kv, .attention.key_length (default d_model / n_head) and the vocabulary size."""
    from fastscore.deps import require

    gguf = require("gguf", "tokenizer")
    reader = gguf.GGUFReader(str(path))

    def field(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    n_head = int(field(f"{arch}.attention.head_count"))
    d_model = int(field(f"{arch}.embedding_length"))
    vocab = field(f"{arch}.vocab_size") or len(field("tokenizer.ggml.tokens") or ())
    return ModelShape(
        n_layer=int(field(f"{arch}.block_count")),
        d_model=d_model,
        n_head=n_head,
        n_kv_head=int(field(f"{arch}.attention.head_count_kv", n_head)),
        head_dim=int(field(f"{arch}.attention.key_length", d_model // n_head)),
        d_ff=int(field(f"{arch}.feed_forward_length")),
        n_vocab=int(vocab),
        source=f"GGUF metadata of {Path(path).name} ({arch}.block_count, embedding_length, feed_forward_length, "
        f"attention.head_count[_kv], key_length; vocab from tokenizer.ggml.tokens)",
    )


def shape_from_hf_config(path: Path) -> ModelShape:
    """From an HF config.json: num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
    num_key_value_heads, head_dim (default hidden_size / heads), vocab_size."""
    config = json.loads((Path(path) / "config.json").read_text() if Path(path).is_dir() else Path(path).read_text())
    n_head = int(config["num_attention_heads"])
    d_model = int(config["hidden_size"])
    return ModelShape(
        n_layer=int(config["num_hidden_layers"]),
        d_model=d_model,
        n_head=n_head,
        n_kv_head=int(config.get("num_key_value_heads") or n_head),
        head_dim=int(config.get("head_dim") or d_model // n_head),
        d_ff=int(config["intermediate_size"]),
        n_vocab=int(config["vocab_size"]),
        source="config.json (num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, "
        "num_key_value_heads, head_dim, vocab_size)",
    )


# ---------------------------------------------------------------- measuring the limit


def measure_sgemm(n: int = 2048, repeats: int = 5, warmup: int = 2, seed: int = 0) -> dict:
    """float32 n x n matmul with numpy's BLAS (thread count set by the caller's environment): median GFLOP/s."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    for _ in range(warmup):
        np.matmul(a, b, out=out)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        np.matmul(a, b, out=out)
        times.append(time.perf_counter() - started)
    seconds = median(times)
    return {"n": n, "repeats": repeats, "seconds_median": seconds, "gflops": gflops(2.0 * n**3, seconds),
            "gflops_best": gflops(2.0 * n**3, min(times))}
