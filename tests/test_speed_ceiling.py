"""bench/lab/speed_ceiling.py: each stage put at its reference, on crafted seconds."""

import pytest

from fastscore.bench.lab.speed_ceiling import SCENARIOS, DecoderSplit, ceiling, decoder_share, render

# 100 s of decoder lane-seconds: 20 first prefill, 10 joining steps, 60 plain steps (30 at their reference), 10 host
SPLIT = DecoderSplit(seconds=100.0, first_prefill=20.0, joins=10.0, plain=60.0, plain_reference=30.0)


def test_the_decoder_share_puts_plain_steps_at_their_reference_and_prefill_at_its_share():
    same, no_first, no_prefill = SCENARIOS
    assert SPLIT.host == pytest.approx(10.0)
    assert decoder_share(SPLIT, 0.5, same) == pytest.approx((30 + 0.5 * 30 + 10) / 100)
    assert decoder_share(SPLIT, 0.5, no_first) == pytest.approx((30 + 0.5 * 10 + 10) / 100)
    assert decoder_share(SPLIT, 0.5, no_prefill) == pytest.approx((30 + 10) / 100)
    # already at the reference, prefill included: nothing left to gain
    at_ref = DecoderSplit(seconds=100.0, first_prefill=20.0, joins=10.0, plain=60.0, plain_reference=60.0)
    assert decoder_share(at_ref, 1.0, same) == pytest.approx(1.0)


def test_the_ceiling_takes_scorings_bound_and_scales_decoding_by_its_sources_share():
    stages = {"seeded": {"load model": 1.0, "build items": 3.0, "score candidate sets": 60.0, "greedy decoding": 50.0},
              "model": {"build items": 40.0, "score candidate sets": 80.0, "greedy decoding": 120.0}}
    bounds = {"seeded": {"score candidate sets": 25.0}, "model": {"score candidate sets": 35.0}}
    other = DecoderSplit(seconds=200.0, first_prefill=0.0, joins=0.0, plain=200.0, plain_reference=100.0)
    splits = {"seeded": SPLIT, "model": other}
    same, no_first, _ = SCENARIOS
    got = ceiling(stages, bounds, splits, 0.5, same)
    assert got["score candidate sets"] == pytest.approx(60.0)
    assert got["greedy decoding"] == pytest.approx(50 * 0.55 + 120 * 0.5)
    # the seeded source builds its items without decoding; the on-policy one decodes attempts: its decoder share
    assert got["build items"] == pytest.approx(3.0 + 40 * 0.5)
    assert got["load model"] == pytest.approx(1.0)
    # taking the first prefill away moves greedy decoding only, never the attempts (decoded before scoring)
    less = ceiling(stages, bounds, splits, 0.5, no_first)
    assert less["greedy decoding"] == pytest.approx(50 * 0.45 + 120 * 0.5)
    assert less["build items"] == got["build items"]


def test_the_table_gives_each_ceilings_speed_up_over_today_and_the_base():
    stages = {"seeded": {"score candidate sets": 60.0, "greedy decoding": 40.0}}
    result = {"date_utc": "d", "item_runs": 2, "sgemm_gflops_all_threads": 100.0, "threads": 2,
              "load_average": [[0.1], [0.2]], "prefill_share": 0.5, "references": {}, "stages": stages,
              "ceilings": {"half": {"score candidate sets": 30.0, "greedy decoding": 20.0}}}
    text = render(result, base_rate=48.0)  # 2 item-runs at 48 an hour: 150 s
    assert "| today (measured) | 60.0 | 40.0 | 0.0 | 0.0 | 100.0 | 1.00 | 1.50 |" in text
    assert "| half | 30.0 | 20.0 | 0.0 | 0.0 | 50.0 | 2.00 | 3.00 |" in text
    assert "× base" not in render(result, base_rate=None)
