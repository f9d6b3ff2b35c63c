"""Lanes: decoder calls side by side on several copies of the model, results in job order, the same rows as one lane.

The scheduling is checked with instrumented fake scorers (a barrier that only two jobs running at once can pass, the
order jobs start in, the threads a lone job gets); thread invariance and the study's rows on the embedded model.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

from fastscore.backends.llamacpp_abort import abort_workers, mark_lane_thread
from fastscore.scorer import Scorer
from fastscore.study.opening import lane_plan
from fastscore.study.runner import StudyConfig, run_study
from fastscore.study.stages.lanes import Lanes, as_lanes


@dataclass
class FakeBackend:
    n_threads: int = 1
    threads_adjustable: bool = True
    set_to: list[int] = field(default_factory=list)

    def set_threads(self, n: int) -> None:
        self.set_to.append(n)
        self.n_threads = n


@dataclass
class FakeScorer:
    name: str
    backend: FakeBackend = field(default_factory=FakeBackend)


def test_jobs_run_side_by_side_costliest_first_and_come_back_in_job_order():
    lanes = Lanes([FakeScorer("a"), FakeScorer("b")])
    both_running = threading.Barrier(2, timeout=10)  # broken unless the first two jobs run at the same time
    started, lock = [], threading.Lock()

    def compute(job: tuple[str, int], scorer: FakeScorer) -> str:
        with lock:
            started.append(job[0])
            first_two = len(started) <= 2
        if first_two:
            both_running.wait()
        return f"{job[0]} on {scorer.name}"

    jobs = [("small", 1), ("big", 9), ("medium", 5), ("tiny", 0)]
    got = list(lanes.ordered(jobs, compute, cost=lambda job: job[1]))
    assert [job for job, _ in got] == jobs
    assert [result.split(" on ")[0] for _, result in got] == ["small", "big", "medium", "tiny"]
    assert set(started[:2]) == {"big", "medium"} and started[2:] == ["small", "tiny"]
    assert {result.split(" on ")[1] for _, result in got} == {"a", "b"}


def test_a_lone_job_runs_on_every_lanes_threads_and_one_lane_in_the_calling_thread():
    first, second = FakeScorer("a"), FakeScorer("b")
    lanes = Lanes([first, second])
    seen = []
    got = list(lanes.ordered(["only"], lambda job, scorer: seen.append((scorer.name, scorer.backend.n_threads))))
    assert seen == [("a", 2)] and len(got) == 1
    assert first.backend.set_to == [2, 1] and first.backend.n_threads == 1 and second.backend.set_to == []

    single = as_lanes(FakeScorer("c"))
    threads = list(single.ordered([1, 2, 3], lambda job, scorer: threading.current_thread()))
    assert all(thread is threading.current_thread() for _, thread in threads)
    assert single.first.backend.set_to == []


def test_an_error_in_a_lane_reaches_the_caller_and_drops_the_jobs_not_started():
    lanes = Lanes([FakeScorer("a"), FakeScorer("b")])
    ran = []

    def compute(job: int, scorer: FakeScorer) -> int:
        ran.append(job)
        if job == 0:
            raise ValueError("item-level failure")
        time.sleep(0.05)
        return job

    with pytest.raises(ValueError, match="item-level failure"):
        list(lanes.ordered(range(40), compute))
    assert len(ran) < 40


def test_lane_plan_shares_the_threads_among_the_lanes():
    base = StudyConfig(threads=2)
    assert lane_plan(base) == (2, 1)
    assert lane_plan(replace(base, lanes=1)) == (1, 2)
    assert lane_plan(replace(base, threads=8)) == (2, 4)
    assert lane_plan(replace(base, threads=1)) == (1, 1)
    assert lane_plan(replace(base, threads=3, lanes=3)) == (3, 1)
    assert lane_plan(replace(base, threads=1, lanes=2)) == (1, 1)
    assert lane_plan(replace(base, backend="onnx", quant="fp32")) == (1, 2)


def test_lanes_on_a_backend_whose_results_may_depend_on_threads_are_refused(tmp_path, study_data):
    from fastscore.errors import DataError
    from fastscore.study.runner import check_config

    with pytest.raises(DataError, match="--lanes 2 needs a backend"):
        check_config(StudyConfig(backend="onnx", quant="fp32", lanes=2, data_dir=study_data, out_dir=tmp_path))


def test_llamacpp_scores_and_greedy_tokens_do_not_depend_on_the_thread_count(smollm_artefact):
    from fastscore.backends.llamacpp import LlamaCppBackend
    from fastscore.records import TokenRequest

    path = smollm_artefact("llamacpp", "f32").path
    requests = [TokenRequest(tokens=tuple(100 + (k * 7919 + j * 31) % 20000 for k in range(300)), score_from=200)
                for j in range(3)]
    runs = {}
    for threads in (1, 2):
        with LlamaCppBackend(path, n_threads=threads) as backend:
            scores = backend.score_tokens(requests)
            decoder = backend.decoder(8)
            logits = decoder.start([r.tokens for r in requests])
            steps = [np.asarray(logits).copy()]
            tokens = [int(np.argmax(row)) for row in steps[0]]
            for _ in range(4):
                steps.append(np.asarray(decoder.step(list(range(len(requests))), tokens)).copy())
                tokens = [int(np.argmax(row)) for row in steps[-1]]
            decoder.close()
            runs[threads] = ([s.logprobs for s in scores], steps)
    lp1, steps1 = runs[1]
    lp2, steps2 = runs[2]
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(lp1, lp2))
    worst_logit = max(float(np.max(np.abs(a - b))) for a, b in zip(steps1, steps2))
    print(f"1 vs 2 threads: max |d log-prob| {worst:.3g}, max |d logit| over 5 decode steps {worst_logit:.3g}")
    assert worst == 0.0 and worst_logit == 0.0


def test_set_threads_changes_an_open_backend_and_not_its_scores(smollm_artefact):
    from fastscore.backends.llamacpp import LlamaCppBackend
    from fastscore.records import TokenRequest

    request = TokenRequest(tokens=tuple(100 + (k * 7919) % 20000 for k in range(200)), score_from=150)
    with LlamaCppBackend(smollm_artefact("llamacpp", "f32").path, n_threads=1) as backend:
        before = backend.score_tokens([request])[0].logprobs
        backend.set_threads(2)
        assert backend.n_threads == 2 and backend.settings.n_threads == 2 and backend.decode_settings.n_threads == 2
        after = backend.score_tokens([request])[0].logprobs
    assert list(before) == list(after)


def test_abort_workers_stops_a_long_decode_in_a_lane_thread(smollm_artefact):
    from fastscore.backends.llamacpp import LlamaCppBackend
    from fastscore.backends.options import LlamaCppOptions
    from fastscore.records import TokenRequest

    backend = LlamaCppBackend(smollm_artefact("llamacpp", "q4_1").path, n_threads=1,
                              options=LlamaCppOptions(n_ctx=4096, max_group_tokens=4096))
    # One group of 2500 tokens: a single llama_decode of many seconds on one thread (see test_interrupt.py).
    request = TokenRequest(tokens=tuple(100 + (k * 7919) % 20000 for k in range(2500)), score_from=2490)
    outcome = {}

    def lane() -> None:
        mark_lane_thread()
        started = time.perf_counter()
        try:
            backend.score_tokens([request])
            outcome["finished"] = time.perf_counter() - started
        except KeyboardInterrupt:
            outcome["aborted"] = time.perf_counter() - started

    try:
        worker = threading.Thread(target=lane)
        worker.start()
        time.sleep(1.0)
        with abort_workers():
            worker.join(timeout=60)
        print(f"lane thread: {outcome}")
        assert "aborted" in outcome and outcome["aborted"] < 10
        assert backend.score_tokens([TokenRequest(tokens=(1, 2, 3), score_from=1)])  # usable after the abort
    finally:
        backend.close()


def test_a_study_on_two_lanes_stores_the_rows_of_one_lane(tmp_path, study_data, monkeypatch):
    """The model's own failures (a call of greedy and sampled requests per chunk) on 1 lane of 2 threads, its calls
    decoded one by one, and on 2 lanes of 1 thread serving the calls' items from one queue (decode_queue.served)."""
    from fastscore.study.stages import decode_queue

    base = StudyConfig(envs=("tools",), limit=2, seed=43, failures="model", data_dir=study_data, n_boot=50,
                       retries=2, threads=2)
    queued = []
    served = decode_queue.served
    monkeypatch.setattr("fastscore.study.stages.decode.served",
                        lambda lanes, calls: queued.append(len(lanes.scorers)) or served(lanes, calls))
    runs = {}
    for lanes in (1, 2):
        out = tmp_path / f"lanes-{lanes}"
        with monkeypatch.context() as patch:
            if lanes == 1:  # the calls' own path: each call decoded whole (Scorer.greedy)
                patch.setattr(Scorer, "can_serve_greedy", lambda self: False)
            outcome = run_study(replace(base, lanes=lanes, out_dir=out))
        assert outcome.n_items == {"tools": 2}
        runs[lanes] = out
    for name in ("items.jsonl", "logprobs.jsonl", "scores.jsonl", "skipped.jsonl"):
        one, two = (Path(runs[n] / name).read_text() for n in (1, 2))
        assert one == two, name
    rows = [json.loads(line) for line in (runs[2] / "scores.jsonl").read_text().splitlines()]
    assert any(row.get("sampled_k") for row in rows)  # the sampled requests ran
    assert 2 in queued and 1 not in queued  # both paths ran: the queue on 2 lanes, the calls on 1
