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


def test_measure_builds_each_sources_split_from_the_decoders_calls_and_saves_as_json(tmp_path, monkeypatch):
    import json

    from fastscore.bench.lab import decode_reference, speed_ceiling, study_bound

    for source in ("seeded", "model"):
        (tmp_path / source).mkdir()
        (tmp_path / source / "config.json").write_text(json.dumps({"failures": source}), encoding="utf-8")

    def bound(folders, threads):
        stage = {"seeded": [("score candidate sets", 60.0, 20.0), ("greedy decoding", 50.0, 10.0)],
                 "model": [("build items", 40.0, 5.0), ("score candidate sets", 80.0, 40.0),
                           ("greedy decoding", 100.0, 30.0)]}
        return {"date_utc": "d", "sgemm": {"gflops": 100.0}, "load_average_at_start": [1.0],
                "load_average_at_end": [1.0],
                "runs": [{"failures": f.name, "item_runs": 10,
                          "stages": [{"stage": n, "measured_seconds": m, "bound_seconds": b} for n, m, b in stage[f.name]]}
                         for f in folders]}

    def reference(folder, scratch, threads):
        # tuple keys, as decode_reference returns them: (whole, first prefill, joins, plain) per call kind
        plain = {("mbpp", "greedy"): {"reference": 20.0}, ("tools", "greedy"): {"reference": 5.0}}
        split = {("mbpp", "greedy"): (60.0, 10.0, 5.0, 40.0), ("tools", "greedy"): (40.0, 10.0, 0.0, 10.0)}
        return {"plain": plain, "split": split}

    monkeypatch.setattr(study_bound, "measure", bound)
    monkeypatch.setattr(decode_reference, "measure", reference)
    monkeypatch.setattr(decode_reference, "render", lambda result: "table")
    result = speed_ceiling.measure(tmp_path, tmp_path / "scratch", 2)
    assert result["splits"]["model"] == {"seconds": 100.0, "first_prefill": 20.0, "joins": 5.0, "plain": 50.0,
                                         "plain_reference": 25.0}
    assert result["prefill_share"] == pytest.approx(60.0 / 140.0)  # scoring's bound over its measured seconds
    share = (25.0 + 60.0 / 140.0 * 25.0 + 25.0) / 100.0  # plain at reference, prefill at its share, host 25 s
    same = result["ceilings"][SCENARIOS[0].name]
    assert same["greedy decoding"] == pytest.approx(150.0 * share)
    assert same["build items"] == pytest.approx(40.0 * share)
    json.loads(json.dumps(result))  # --json-out writes it


def test_decode_references_tables_list_call_kinds_in_order():
    from fastscore.bench.lab.decode_reference import render as reference_table

    result = {"sgemm_gflops": 100.0, "cells": 448, "mean_cells": 430.0, "k_rate": 1.7e10, "v_rate": 8.7e9,
              "row_flops": 2.69e8, "cell_bytes": 23040.0,
              "plain": {("tools", "greedy"): {"steps": 2, "rows": 10, "cells": 4000, "measured": 2.0, "reference": 1.0,
                                             "arithmetic": 0.5},
                        ("mbpp", "greedy"): {"steps": 3, "rows": 30, "cells": 9000, "measured": 6.0, "reference": 3.0,
                                            "arithmetic": 2.0}},
              "split": {("tools", "greedy"): (4.0, 1.0, 1.0, 2.0), ("mbpp", "greedy"): (8.0, 1.0, 0.5, 6.0)}}
    text = reference_table(result)
    assert text.index("| mbpp greedy | 3 |") < text.index("| tools greedy | 2 |")
    assert "| tools greedy | 2 | 10 | 400 | 2.0 | 1.0: 0.5 + 0.5 | 0.50 |" in text
    assert "All plain steps: 8.0 s measured, 4.0 s at the reference, 0.50." in text
    assert "| mbpp greedy | 8.0 | 1.0 | 0.5 | 6.0 | 0.5 |" in text
