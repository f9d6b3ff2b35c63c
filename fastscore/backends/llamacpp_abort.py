"""Ctrl-C during a long llama_decode.

Python runs signal handlers only in the main thread, between bytecodes; a llama_decode of a big scoring group keeps
the main thread inside C for tens of seconds (27 s measured), so Ctrl-C used to wait for the call to return.
llama.cpp polls an abort callback from its compute loop (between graph nodes, on the calling thread): while a
decode runs, SIGINT only sets a flag, the callback (a few Python bytecodes, where the pending handler gets its turn)
tells llama.cpp to stop, and KeyboardInterrupt is raised once llama_decode has returned. Work already stored
(output lines, study append logs) stays, so the run can be resumed.

A decode in another thread (a study lane, fastscore.study.stages.lanes) gets no signal: the main thread, interrupted,
stops it with `abort_workers()`, and its llama_decode returns "aborted".
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

# Set while the main thread stops the llama.cpp calls of its lane threads (abort_workers).
_workers_stop = threading.Event()
_lane = threading.local()


def mark_lane_thread() -> None:
    """This thread's llama_decode calls poll abort_workers (other threads, e.g. a server's, get no callback)."""
    _lane.stoppable = True


@contextlib.contextmanager
def abort_workers() -> Iterator[None]:
    """Inside: every llama_decode running or starting in a lane thread is aborted. Interrupted again before the
    block ends, the flag stays set, so the lanes still stop while the interpreter winds down."""
    _workers_stop.set()
    yield
    _workers_stop.clear()


class AbortOnInterrupt:
    def __init__(self, L, ctx) -> None:
        self.L, self.ctx = L, ctx
        self.requested = False
        # Kept on the instance: llama.cpp holds only the raw function pointer.
        self._callback = L.ggml_abort_callback(self._should_abort)
        self._worker_callback = L.ggml_abort_callback(lambda _data: _workers_stop.is_set())

    def _should_abort(self, _data) -> bool:
        return self.requested

    def _on_sigint(self, _signum, _frame) -> None:
        self.requested = True

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Around one llama_decode: SIGINT aborts the call, then raises KeyboardInterrupt.

        Only with Python's default SIGINT handler in the main thread; otherwise nothing is installed, because a
        handler raising inside the callback would be swallowed by ctypes. In a lane thread (mark_lane_thread) the
        call is aborted (and KeyboardInterrupt raised) while abort_workers() is in effect.
        """
        if threading.current_thread() is not threading.main_thread():
            if not getattr(_lane, "stoppable", False):
                yield
                return
            if _workers_stop.is_set():
                raise KeyboardInterrupt
            with self._installed(self._worker_callback):
                yield
            if _workers_stop.is_set():
                raise KeyboardInterrupt
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield
            return
        self.requested = False
        signal.signal(signal.SIGINT, self._on_sigint)
        try:
            with self._installed(self._callback):
                yield
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.requested:
            log.info("llama_decode aborted by SIGINT")
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def _installed(self, callback) -> Iterator[None]:
        """`callback` as the context's abort callback for the block, none after it."""
        self.L.llama_set_abort_callback(self.ctx, callback, None)
        try:
            yield
        finally:
            self.L.llama_set_abort_callback(self.ctx, self.L.ggml_abort_callback(0), None)
