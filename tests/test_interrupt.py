"""Ctrl-C during a long llama_decode takes effect within a couple of seconds (it used to wait ~27 s for the call)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fastscore.backends.llamacpp import LlamaCppBackend
from fastscore.backends.options import LlamaCppOptions
from fastscore.outputs import partial_path
from fastscore.records import TokenRequest

pytest.importorskip("llama_cpp")


@pytest.fixture
def sigint_deliverable():
    """Ctrl-C as an interactive terminal delivers it, whatever pytest inherited.

    A shell without job control starts a background command (`make test &`, a CI runner's script) with SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler; such a process is meant not to be interrupted,
    so the behaviour under test cannot be seen there.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _child_with_default_sigint() -> None:
    """preexec_fn: the CLI process starts with SIGINT at its default, as from a terminal (see sigint_deliverable)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_sigint_aborts_a_long_decode_promptly(smollm_artefact, sigint_deliverable):
    backend = LlamaCppBackend(smollm_artefact("llamacpp", "q4_1").path, n_threads=1,
                              options=LlamaCppOptions(n_ctx=4096, max_group_tokens=4096))
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


def test_ctrl_c_stops_score_promptly_and_keeps_the_finished_lines(tmp_path, smollm_artefact,
                                                                  sigint_deliverable):
    """The real CLI in its own process: SIGINT in the middle of a long request -> exit 130 within a couple of
    seconds, the finished lines in OUT.partial, and the message says how to resume."""
    smollm_artefact("llamacpp", "q4_1")
    quick = {"id": "quick", "messages": [{"role": "user", "content": "Hi"}], "candidates": ["Hello"]}
    long = {"id": "long", "messages": [{"role": "user", "content": "word " * 2000}], "candidates": ["ok"]}
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps(quick) + "\n" + json.dumps(long) + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([str(Path(sys.executable).with_name("fastscore")), "score", str(requests), "--out", str(out),
                             "--threads", "1", "--chunk-size", "1"], stderr=subprocess.PIPE, text=True,
                            preexec_fn=_child_with_default_sigint)
    try:
        partial = partial_path(out)
        deadline = time.monotonic() + 120
        while not (partial.exists() and partial.read_text().count("\n") == 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # well inside the long request's llama_decode
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        waited = time.monotonic() - sent
    finally:
        proc.kill()
    print(stderr[-500:], f"exited {waited:.2f} s after SIGINT")
    assert proc.returncode == 130 and waited < 3.0
    assert "Interrupted" in stderr and "rerun with --resume" in stderr and "Traceback" not in stderr
    assert [json.loads(x)["id"] for x in partial.read_text().splitlines()] == ["quick"]
    assert not out.exists()
