"""Typed backend options: one frozen, validated record per backend, reachable from the model selection and the CLI.

Importing this module imports no backend; `parse_options` turns the CLI's `key=value` pairs into the record.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastscore.errors import RequestError, SettingsError
from fastscore.variants import check_backend

# llama.cpp's flash-attention modes by name: the value of its llama_flash_attn_type.
FLASH_ATTN_MODES = {"auto": -1, "off": 0, "on": 1}


@dataclass(frozen=True)
class KVCacheType:
    ggml_type: int  # its ggml_type id (llama_context_params.type_k/type_v)
    bytes_per_value: float  # memory per stored key or value element (q8_0: 32 values in 34 bytes)


# The KV-cache types offered by name: the one table the options check, the llama.cpp context and the memory
# planner read.
KV_CACHE_TYPES = {"f32": KVCacheType(0, 4.0), "f16": KVCacheType(1, 2.0), "q8_0": KVCacheType(8, 34 / 32)}
DECODE_KV_LAYOUTS = ("streams", "unified")
# Options that change the scoring arithmetic, not only how the batch is laid out (meta.json's batch dependence was
# measured at their defaults).
ARITHMETIC_OPTIONS = ("kv_type", "flash_attn")


DEFAULT_N_CTX = 4096  # llama.cpp's context when n_ctx is not given, or the model's trained context if smaller


@dataclass(frozen=True)
class LlamaCppOptions:
    # None: DEFAULT_N_CTX, or the model's trained context if that is smaller. A value beyond the trained context is
    # refused when the model is loaded (positions past it were never trained: their scores would mean nothing).
    n_ctx: int | None = None
    n_seq_max: int = 256
    n_ubatch: int = 512
    # Exact arithmetic by default: an f16 KV cache and CPU flash attention each move log-probs by ~0.015 nats,
    # several times the f32 parity tolerance; "on"/"f16" are 10-20% faster and left to callers who opt in.
    flash_attn: str = "off"
    kv_type: str = "f32"
    # Greedy decoding: "streams" gives each context a KV stream of its own, so a step's token attends over its own
    # context only (prefixes are computed once and copied between streams); "unified" shares one cache of all
    # contexts, where every step attends over every context's cells (masked) and only flash attention skips them.
    decode_kv: str = "streams"
    # Exact by default, as scoring: with streams, flash attention buys little (docs/performance.md, "Greedy decoding").
    decode_flash_attn: str = "off"
    # decode_kv="streams": the KV memory one decoding context may take; more contexts are decoded in several.
    decode_memory_mb: int = 3072
    # Tokens of one scoring group (a KV cache filled from empty). Without flash attention every token attends
    # over all cells of its group, so big groups waste attention and small ones recompute shared prefixes:
    # 1536 measured fastest overall (f32 40.5 s -> 26.5 s, q4_0 36.1 s -> 23.0 s vs 4096 on the bench workload).
    max_group_tokens: int = 1536
    # decode_kv="unified": prefill tokens of one greedy-decoding cache (at least n_ctx; a bigger cache is prefilled
    # in forwards of n_ctx).
    # Fewer caches mean fuller steps (one forward per cache), but every step's attention then scans more cells:
    # 18 contexts in one cache of ~2,300 cells stepped in 5.5-8.7 s vs 2.1-3.1 s in two caches (llama.cpp f32, flash
    # attention, load average ~11 on 2 cores; measured by hand, 2 alternations), so the default keeps caches of n_ctx.
    max_decode_tokens: int = 4096
    # f32 weights computed from their compact file (Q4_1 / Q8_0 blocks holding the same f32 values, e.g. the
    # embedded model's shipped file) when the llama.cpp build decodes it to the same bits (checked once per build
    # and CPU): the same scores, a fifth of the weight bytes per decoding step. False: the f32 file.
    compact_weights: bool = True

    def __post_init__(self) -> None:
        for name in ("flash_attn", "decode_flash_attn"):
            if getattr(self, name) not in FLASH_ATTN_MODES:
                raise RequestError(f"llamacpp option {name} must be one of {', '.join(FLASH_ATTN_MODES)}, "
                                   f"not {getattr(self, name)!r}")
        if self.decode_kv not in DECODE_KV_LAYOUTS:
            raise RequestError(f"llamacpp option decode_kv must be one of {', '.join(DECODE_KV_LAYOUTS)}, "
                               f"not {self.decode_kv!r}")
        if self.decode_memory_mb < 1:
            raise RequestError(f"llamacpp option decode_memory_mb must be positive (got {self.decode_memory_mb})")
        if self.kv_type not in KV_CACHE_TYPES:
            raise RequestError(f"llamacpp option kv_type must be one of {', '.join(KV_CACHE_TYPES)}, "
                               f"not {self.kv_type!r}")
        if (self.n_ctx is not None and self.n_ctx < 16) or min(self.n_ubatch, self.n_seq_max, self.max_group_tokens, self.max_decode_tokens) < 1:
            raise RequestError("llamacpp options n_ubatch, n_seq_max, max_group_tokens and max_decode_tokens must be "
                               "positive and "
                               f"n_ctx at least 16 (got {self})")


@dataclass(frozen=True)
class OnnxOptions:
    # Upper bound on the logits and past/present key/values one continuation batch may hold.
    max_batch_bytes: int = 1 << 29
    # Long prefixes run in pieces of this many tokens (attention scores grow with the square of a piece).
    prefix_chunk: int = 1024
    # Off: every request runs whole on its own (the no-sharing baseline for benchmarks).
    share_prefixes: bool = True

    def __post_init__(self) -> None:
        if self.max_batch_bytes < 1 or self.prefix_chunk < 1:
            raise RequestError(f"onnx options max_batch_bytes and prefix_chunk must be positive (got {self})")


@dataclass(frozen=True)
class ReferenceOptions:
    """The reference is deliberately plain: nothing to tune."""


@dataclass(frozen=True)
class BackendKind:
    options: type  # its typed options record
    module: str  # imported only when the backend is chosen (fastscore.backends.backend_class)
    cls: str


# The one list of backends by name (fastscore.variants holds their weights types).
BACKENDS: dict[str, BackendKind] = {
    "llamacpp": BackendKind(LlamaCppOptions, "fastscore.backends.llamacpp", "LlamaCppBackend"),
    "onnx": BackendKind(OnnxOptions, "fastscore.backends.onnx", "OnnxBackend"),
    "reference": BackendKind(ReferenceOptions, "fastscore.backends.reference", "ReferenceBackend"),
}


def options_for(backend: str, fields: Mapping[str, Any] | None = None):
    """The backend's options record with `fields` set; a field the backend lacks is a RequestError naming the
    valid ones."""
    check_backend(backend)
    cls = BACKENDS[backend].options
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(fields or {}) - set(names))
    if unknown:
        raise RequestError(f"backend {backend!r} has no option {', '.join(unknown)}; "
                           f"its options: {', '.join(names) or 'none'}")
    return cls(**(fields or {}))


def _field_type(cls: type, name: str) -> type:
    """bool, int or str: the type a field's text is parsed as (an optional int is an int)."""
    hint = typing.get_type_hints(cls).get(name, str)
    kinds = typing.get_args(hint) or (hint,)
    return next((kind for kind in (bool, int) if kind in kinds), str)


def parse_options(backend: str, pairs: Sequence[str]):
    """`key=value` strings (the CLI's --backend-option) -> the backend's options record, values typed by field. A
    key given twice with different values is a SettingsError: neither silently wins."""
    fields: dict[str, Any] = {}
    check_backend(backend)
    cls = BACKENDS[backend].options
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise RequestError(f"backend option {pair!r} is not key=value")
        kind = _field_type(cls, key)
        try:
            if kind is bool:
                if text.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError(text)
                value: Any = text.lower() in ("true", "1", "yes", "on")
            else:
                value = kind(text)
        except ValueError:
            raise RequestError(f"backend option {key}={text!r}: expected a value of type {kind.__name__}") from None
        if key in fields and fields[key] != value:
            raise SettingsError(f"backend option {key} is given twice, as {fields[key]!r} and as {value!r}"
                                + (" (--n-ctx sets n_ctx too)" if key == "n_ctx" else "") + ": give it once")
        fields[key] = value
    return options_for(backend, fields)
