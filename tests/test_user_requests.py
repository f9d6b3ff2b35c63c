"""bench throughput and bench quant on a user's own scoring file (--requests), not the study's items."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fastscore.cli import main

pytest.importorskip("llama_cpp")
REQUESTS = [
    {"id": "a", "messages": [{"role": "user", "content": "Name a colour."}], "candidates": ["Blue", "Red", "Green"]},
    {"id": "b", "messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue"},
                             {"role": "user", "content": "Another one."}], "candidates": ["Red", "Yellow"]},
]


@pytest.fixture
def requests_file(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    return path


def test_quant_check_on_a_requests_file_compares_each_variant_with_the_reference(requests_file, tmp_path,
                                                                                  tiny_model):
    out = tmp_path / "quant"
    result = CliRunner().invoke(main, ["bench", "quant", "--requests", str(requests_file), "--model",
                                       str(tiny_model("llama")), "--variants", "llamacpp:f32", "--out", str(out),
                                       "--threads", "2"])
    print(result.output)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "quant.json").read_text())
    f32 = summary["variants"]["llamacpp:f32"]
    assert (f32["n_requests"], f32["n_candidates"]) == (2, 5)
    assert f32["token_abs_diff"]["max"] < 2e-3  # f32 GGUF against the fp32 reference: exact to rounding
    assert f32["contrast_sign_flips"]["n"] == 3 + 1
    assert (out / "llamacpp-f32.jsonl").is_file() and (out / "reference-fp32.jsonl.meta.json").is_file()
    assert "llamacpp:f32" in (out / "quant.md").read_text()


def test_bench_on_a_requests_file(requests_file, tmp_path):
    json_out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, [
        "bench", "throughput", "--requests", str(requests_file), "--backends", "llamacpp", "--quants", "q4_1",
        "--repeats", "1", "--set", "sgemm_n=128", "--threads", "2", "--skip-reference", "--set", "pp_tokens=16",
        "--set", "per_request_limit=1", "--set", "greedy_batches=1", "--set", "new_tokens=1",
        "--json-out", str(json_out)])
    print(result.output)
    assert result.exit_code == 0, result.output
    summary = json.loads(json_out.read_text())
    assert summary["workload"]["requests"] == 5 and summary["workload"]["contexts"] == 2
    assert summary["backends"]["llamacpp:q4_1"]["trie_minimal_tokens"] < summary["backends"]["llamacpp:q4_1"][
        "requested_tokens"]
