"""Timing every node of llama.cpp's compute graph through ggml's scheduler eval callback (`cb_eval`).

With a callback installed, ggml_backend_sched asks it (ask=True) about each graph node in turn; a node it wants is
computed, together with the nodes before it that were not wanted, as its own graph, and the callback is called
again (ask=False) once that is done. Wanting every node that does work (views, reshapes and permutes do none: they
ride along with the next node) therefore times each node on its own: the time from the ask=True answer to the
ask=False call is that node's compute, threads included. What this changes against an unprofiled run (each node a
graph of its own: one thread-pool start and barrier per node, no op fusion) is measured by the caller, who runs the
same work without the callback and compares (fastscore.bench.lab.op_profile).

llama-cpp-python binds neither ggml_tensor nor ggml_op_desc; the tensor's fields are read through a ctypes mirror of
`struct ggml_tensor` (ggml.h), checked against libggml's own size (ggml_tensor_overhead) before use, and the op name
comes from libggml's exported ggml_op_desc.
"""

from __future__ import annotations

import ctypes
import time
from collections import defaultdict

from fastscore.bench.lab.op_kinds import VIEW_OPS, classify, matmul_flops
from fastscore.errors import BenchmarkError

GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64
GGML_OBJECT_SIZE = 32  # struct ggml_object: offset, size, next, type, padding


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of ggml.h (the fields up to and past the name)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
                ("nb", ctypes.c_size_t * GGML_MAX_DIMS), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * GGML_MAX_SRC), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * GGML_MAX_NAME), ("extra", ctypes.c_void_p),
                ("padding", ctypes.c_char * 8)]


def ggml_library() -> ctypes.CDLL:
    """A handle on the libllama that llama_cpp loaded (its libggml symbols resolve through it), with the prototypes
    used here."""
    from llama_cpp import llama_cpp as bindings

    lib = ctypes.CDLL(bindings._lib._name)
    lib.ggml_op_desc.argtypes, lib.ggml_op_desc.restype = [ctypes.c_void_p], ctypes.c_char_p
    lib.ggml_op_name.argtypes, lib.ggml_op_name.restype = [ctypes.c_int], ctypes.c_char_p
    lib.ggml_tensor_overhead.argtypes, lib.ggml_tensor_overhead.restype = [], ctypes.c_size_t
    expected = lib.ggml_tensor_overhead() - GGML_OBJECT_SIZE
    if expected != ctypes.sizeof(GgmlTensor):
        raise BenchmarkError(f"this libggml's struct ggml_tensor is {expected} bytes, the profiler's mirror "
                             f"{ctypes.sizeof(GgmlTensor)}: ggml.h changed, update fastscore.bench.lab.op_capture")
    return lib


class NodeTimer:
    """The eval callback: times every node that does work and keeps per-(phase, kind, op) totals.

    `phase` labels what runs (set it before each piece of work); `callback` goes into the context params' cb_eval.
    `first_layer_kq` keeps the shape of every layer-0 KQ product ([n_kv, n_tokens, n_head, n_stream]): one per
    micro-batch, i.e. how many cells each micro-batch's tokens attended over.
    """

    def __init__(self) -> None:
        lib = ggml_library()
        self._desc, self._op_name = lib.ggml_op_desc, lib.ggml_op_name
        self._is_view: dict[int, bool] = {}
        self._t0 = 0.0
        self.phase = "default"
        self.totals: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        self.first_layer_kq: dict[str, list[tuple[int, ...]]] = defaultdict(list)
        self.error: BaseException | None = None
        self.callback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(self._eval)

    def _eval(self, t: int, ask: bool, user_data) -> bool:
        # An exception must not escape: ctypes would return False, and a False at ask=False stops the graph.
        try:
            if ask:
                op = GgmlTensor.from_address(t).op
                view = self._is_view.get(op)
                if view is None:
                    view = self._is_view[op] = self._op_name(op).decode() in VIEW_OPS
                if view:
                    return False  # computed with the next node that does work (they cost nothing)
                self._t0 = time.perf_counter()
                return True
            seconds = time.perf_counter() - self._t0
            self._record(t, seconds)
        except BaseException as exc:  # noqa: BLE001 - kept and raised by check() after the decode
            self.error = self.error or exc
        return True

    def _record(self, t: int, seconds: float) -> None:
        tensor = GgmlTensor.from_address(t)
        op = self._desc(t).decode()
        name = tensor.name.decode(errors="replace")
        sources = [GgmlTensor.from_address(p) for p in tensor.src if p]
        kind = classify(op, name, [s.name.decode(errors="replace") for s in sources])
        ne = tuple(int(x) for x in tensor.ne)
        row = self.totals[(self.phase, kind, op)]
        row[0] += 1
        row[1] += seconds
        row[2] += matmul_flops(op, ne, int(sources[0].ne[0]) if sources else 0)
        if kind == "attn KQ" and name == "kq-0":
            self.first_layer_kq[self.phase].append(ne)

    def check(self) -> None:
        if self.error is not None:
            raise BenchmarkError(f"the op profiler's callback failed: {self.error!r}") from self.error

    def reset(self) -> None:
        self.totals.clear()
        self.first_layer_kq.clear()

    def rows(self) -> list[dict]:
        """Every (phase, kind, op) total as a JSON-safe row."""
        return [{"phase": p, "kind": k, "op": o, "nodes": int(v[0]), "seconds": v[1], "flops": v[2]}
                for (p, k, o), v in sorted(self.totals.items())]


class TimedLlama:
    """The llama_cpp module with llama_decode timed (every other name passes through): the time inside llama.cpp,
    against which the node times are set. With an `eval_callback` (NodeTimer.callback), every context created
    through it carries that callback, so the backend's own code path is profiled without knowing it."""

    def __init__(self, module, eval_callback=None) -> None:
        self._module = module
        self.eval_callback = eval_callback
        self.decode_seconds = 0.0
        self.decode_calls = 0

    def __getattr__(self, name: str):
        return getattr(self._module, name)

    def llama_decode(self, ctx, batch) -> int:
        started = time.perf_counter()
        try:
            return self._module.llama_decode(ctx, batch)
        finally:
            self.decode_seconds += time.perf_counter() - started
            self.decode_calls += 1

    def llama_init_from_model(self, model, params):
        if self.eval_callback is not None:
            params.cb_eval = self.eval_callback
        return self._module.llama_init_from_model(model, params)

    def reset(self) -> None:
        self.decode_seconds, self.decode_calls = 0.0, 0


def observed_backend(path, n_threads: int | None, options, library: TimedLlama, compact=None):
    """The product's llama.cpp backend with every llama.cpp call going through `library`: a subclass made here, so
    the backend itself carries no profiling code. `compact`: the weights file the product computes from instead of
    `path` (LlamaCppBackend's `compact`; its bits were checked when the product opened it)."""
    from fastscore.backends.llamacpp import LlamaCppBackend

    class ObservedLlamaCppBackend(LlamaCppBackend):
        def llama_library(self, module):
            return library

    return ObservedLlamaCppBackend(path, n_threads, options, compact=compact, check_compact=False)
