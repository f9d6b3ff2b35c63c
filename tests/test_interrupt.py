"""Ctrl-C during a long llama_decode takes effect within a couple of seconds (it used to wait ~27 s for the call)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from fastscore.backends.llamacpp import LlamaCppBackend
from fastscore.records import TokenRequest

pytest.importorskip("llama_cpp")


def test_sigint_aborts_a_long_decode_promptly(smollm_artefact):
    backend = LlamaCppBackend(smollm_artefact("llamacpp", "q4_1").path, n_threads=1, n_ctx=4096,
                              max_group_tokens=4096, progress=False)
    try:
        # One group of 2500 tokens: a single llama_decode of tens of seconds on one thread (measured: 4000 tokens
        # took 165 s on a loaded machine, and SIGINT took effect 115 s late before the abort callback).
        request = TokenRequest(tokens=tuple(100 + (k * 7919) % 20000 for k in range(2500)), score_from=2490)
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        started = time.perf_counter()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            backend.score_tokens([request])
        stopped = time.perf_counter() - started
        timer.join()
        print(f"stopped {stopped - 1.0:.2f} s after SIGINT")
        assert stopped < 3.0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
        # The backend still works after an aborted call.
        [scores] = backend.score_tokens([TokenRequest(tokens=(1, 2, 3, 4), score_from=2)])
        assert len(scores.logprobs) == 2
    finally:
        backend.close()
