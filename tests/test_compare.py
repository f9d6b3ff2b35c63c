"""`fastscore compare`: differences between two score outputs, computed from the files as written."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fastscore.cli import main
from fastscore.compare import compare_files
from fastscore.mathops import wilson_interval


def _line(rid, candidates):
    return {"id": rid, "candidates": [
        {"text": text, "logprob": sum(lps), "token_ids": list(range(len(lps))), "token_logprobs": lps,
         "token_is_argmax": flags} for text, lps, flags in candidates]}


def _write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_compare_counts_differences_flips_and_argmax_changes(tmp_path):
    a = _write(tmp_path / "a.jsonl", [
        _line("r1", [("x", [-1.0, -2.0], [True, False]), ("y", [-4.0], [False])]),
        _line("r2", [("p", [-0.5], [True]), ("q", [-0.6], [True]), ("s", [-3.0], [False])]),
    ])
    b = _write(tmp_path / "b.jsonl", [
        _line("r1", [("x", [-1.0, -2.5], [True, False]), ("y", [-3.0], [True])]),
        _line("r2", [("p", [-0.7], [True]), ("q", [-0.6], [True]), ("s", [-3.0], [False])]),
        _line("r3", [("z", [-1.0], [True])]),
    ])
    c = compare_files(a, b)
    assert (c.n_requests, c.n_candidates, c.n_tokens, c.only_in_a, c.only_in_b) == (2, 5, 6, 0, 1)
    assert c.token_abs_diff["max"] == pytest.approx(1.0) and c.token_abs_diff["mean"] == pytest.approx(1.7 / 6)
    assert c.candidate_diff["max_abs"] == pytest.approx(1.0)
    assert c.candidate_diff["mean_signed"] == pytest.approx((-0.5 + 1.0 - 0.2) / 5)
    # r1: x (-3) vs y (-4) -> x (-3.5) vs y (-3): flipped; r2: p > q -> q > p flipped, p/s and q/s kept.
    assert (c.contrast_sign_flips.count, c.contrast_sign_flips.n) == (2, 4)
    assert (c.candidate_argmax_changes.count, c.candidate_argmax_changes.n) == (2, 2)
    assert (c.token_argmax_changes.count, c.token_argmax_changes.n) == (1, 6)
    assert (c.contrast_sign_flips.low, c.contrast_sign_flips.high) == wilson_interval(2, 4)


def test_wilson_interval_matches_the_closed_form():
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)  # the textbook value for 0/10
    low, high = wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)


def test_compare_cli_prints_and_writes_json(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_line(1, [("x", [-1.0], [True]), ("y", [-2.0], [False])])])
    b = _write(tmp_path / "b.jsonl", [_line(1, [("x", [-2.5], [False]), ("y", [-2.0], [True])])])
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--json-out", str(tmp_path / "c.json")])
    assert result.exit_code == 0, result.output
    assert "candidate contrast sign flips: 1/1" in result.output
    assert json.loads((tmp_path / "c.json").read_text())["candidate_argmax_changes"]["count"] == 1
    other = _write(tmp_path / "o.jsonl", [_line(1, [("x", [-1.0], [True]), ("zz", [-2.0], [False])])])
    refused = CliRunner().invoke(main, ["compare", str(a), str(other)])
    assert refused.exit_code == 6 and "different candidates" in refused.output
