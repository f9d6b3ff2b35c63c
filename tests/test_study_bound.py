"""fastscore.bench.lab.study_bound's arithmetic on crafted stage tables (hand-checked numbers)."""

from __future__ import annotations

import pytest

from fastscore.bench.roofline import ModelShape, non_embedding_params
from fastscore.bench.lab.study_bound import flops_per_computed_token, pooled, run_bound

# One layer: attention 4 x 8 x 8 = 256 weights, MLP 3 x 8 x 16 = 384: 640 per token, 1,280 FLOPs.
SHAPE = ModelShape(n_layer=1, d_model=8, n_head=2, n_kv_head=2, head_dim=4, d_ff=16, n_vocab=100)


def _work(failures: str, stages: dict, items: int) -> dict:
    return {"folder": failures, "failures": failures, "stages": stages, "items": {"tools": items}}


def test_a_stage_is_bounded_by_its_tokens_matmuls_at_the_sgemm_rate():
    assert non_embedding_params(SHAPE) == 640 and flops_per_computed_token(SHAPE) == 1280
    work = _work("seeded", {"load model": (2.0, None), "score candidate sets": (10.0, 1_000_000),
                            "greedy decoding": (5.0, 500_000)}, items=4)
    run = run_bound(work, SHAPE, sgemm_gflops=1.28)  # 1.28e9 FLOP/s: 1e6 tokens in exactly 1 s
    by_stage = {s.stage: s for s in run.stages}
    assert by_stage["load model"].bound_seconds == 0 and by_stage["load model"].fraction_of_bound == 0
    assert by_stage["score candidate sets"].bound_seconds == pytest.approx(1.0)
    assert by_stage["score candidate sets"].fraction_of_bound == pytest.approx(0.1)
    assert by_stage["greedy decoding"].bound_seconds == pytest.approx(0.5)
    assert run.measured_seconds == 17.0 and run.bound_seconds == pytest.approx(1.5)
    assert run.per_hour(run.measured_seconds) == pytest.approx(3600 * 4 / 17)
    assert run.per_hour(run.bound_seconds) == pytest.approx(9600)


def test_pooled_sums_same_named_stages_and_item_runs():
    a = run_bound(_work("seeded", {"score candidate sets": (10.0, 1_000_000)}, 4), SHAPE, 1.28)
    b = run_bound(_work("model", {"build items": (3.0, 2_000_000), "score candidate sets": (6.0, 1_000_000)}, 2),
                  SHAPE, 1.28)
    both = pooled([a, b])
    assert both.failures == "seeded+model" and both.item_runs == 6
    assert [s.stage for s in both.stages] == ["score candidate sets", "build items"]
    assert both.stages[0].tokens == 2_000_000 and both.stages[0].measured_seconds == 16.0
    assert both.bound_seconds == pytest.approx(4.0)
    assert both.per_hour(both.bound_seconds) == pytest.approx(5400)
