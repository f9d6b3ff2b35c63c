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


def _score_output_in(fmt, path, lines):
    """A score output as `fastscore score --format fmt` writes it (tables through fastscore.tables' own writer)."""
    from fastscore.tables import flatten, write_table

    if fmt == "jsonl":
        return _write(path, lines)
    indexed = [line | {"candidates": [{"index": k} | c for k, c in enumerate(line["candidates"])]} for line in lines]
    write_table([row for line in indexed for row in flatten(line)], path, fmt)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_compare_reads_every_score_format_and_lists_the_most_changed_candidates(tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    a = _score_output_in(fmt, tmp_path / f"a.{fmt}", [
        _line("r1", [("x", [-1.0, -2.0], [True, False]), ("y", [-4.0], [False])]),
        _line("r2", [("a long candidate text\nwith a newline " + "z" * 60, [-0.5], [True]), ("q", [-0.6], [True])]),
    ])
    b = _score_output_in(fmt, tmp_path / f"b.{fmt}", [
        _line("r1", [("x", [-1.0, -2.5], [True, False]), ("y", [-3.0], [True])]),
        _line("r2", [("a long candidate text\nwith a newline " + "z" * 60, [-0.7], [True]), ("q", [-0.6], [True])]),
    ])
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "2 requests, 4 candidates, 5 tokens compared" in result.output
    table = result.output.split("most changed candidates (3 of 4):\n")[1].splitlines()
    assert table[0].split()[:3] == ["id", "cand", "text"]
    # largest |Δ| first: r1/y +1.0, r1/x -0.5, r2/0 -0.2; texts clipped to one line
    assert [row.split()[:2] for row in table[1:]] == [["r1", "1"], ["r1", "0"], ["r2", "0"]]
    assert table[1].split()[-3:] == ["-4.0000", "-3.0000", "+1.0000"]
    assert "a long candidate text with a newline zz…" in table[3] and "z" * 5 not in table[3]


def test_compare_csv_against_jsonl_of_the_same_run_finds_no_difference(tmp_path):
    lines = [_line("r1", [("x", [-1.0, -2.0], [True, False]), ("y", [-4.0], [False])])]
    result = CliRunner().invoke(main, ["compare", str(_score_output_in("jsonl", tmp_path / "a.jsonl", lines)),
                                       str(_score_output_in("csv", tmp_path / "a.csv", lines))])
    assert result.exit_code == 0, result.output
    assert "max 0, mean 0" in result.output and "+0.0000" in result.output


@pytest.mark.parametrize("wrong", ["requests", "folder", "csv", "binary"])
def test_a_wrong_file_is_one_line_naming_it_and_what_was_expected(tmp_path, wrong):
    good = _write(tmp_path / "a.jsonl", [_line("r1", [("x", [-1.0], [True])])])
    if wrong == "requests":
        bad = tmp_path / "requests.jsonl"
        bad.write_text(json.dumps({"id": "r1", "messages": [{"role": "user", "content": "hi"}],
                                   "candidates": ["x", "y"]}) + "\n")
    elif wrong == "folder":
        bad = tmp_path / "study"
        (bad / "seeded").mkdir(parents=True)
    elif wrong == "csv":
        bad = tmp_path / "other.csv"
        bad.write_text("name,value\nfoo,1\n")
    else:
        bad = tmp_path / "scores.parquet"
        bad.write_bytes(b"\x00\x01 not parquet at all")
        pytest.importorskip("pyarrow")
    result = CliRunner().invoke(main, ["compare", str(good), str(bad)])
    assert result.exit_code == 6, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    message = result.output.strip()
    assert "\n" not in message and "Traceback" not in message
    assert str(bad) in message and "expected a `fastscore score` output" in message
