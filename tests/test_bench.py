"""Benchmark maths on crafted numbers, and a smoke run of `fastscore bench throughput` at tiny sizes (no timing
assertions)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fastscore.bench.figures import backend_figures, best_llamacpp_type, max_abs_diff, target
from fastscore.bench.roofline import (
    ModelShape,
    attention_flops,
    flops_per_token,
    WEIGHTS,
    layer_matmul_params,
    layer_weight_params,
    lm_head_flops,
    median,
    non_embedding_params,
    ratio,
    shape_from_hf_config,
    workload_flops,
)
from fastscore.bench.workload import all_positions, requests_digest
from fastscore.engine.trie import distinct_prefix_positions
from fastscore.records import TokenRequest

TINY = ModelShape(n_layer=2, d_model=4, n_head=2, n_kv_head=1, head_dim=2, d_ff=8, n_vocab=10)
SMOLLM2_135M = ModelShape(n_layer=30, d_model=576, n_head=9, n_kv_head=3, head_dim=64, d_ff=1536, n_vocab=49152)


def test_flops_per_token_on_a_crafted_shape():
    # q 4x4 + k,v 2 x 4x2 + o 4x4 = 48; gated MLP 3 x 4x8 = 96; per layer 144, two layers 288
    assert layer_matmul_params(TINY) == 144
    assert non_embedding_params(TINY) == 288
    # attention at position 3: 4 x layers 2 x heads 2 x head_dim 2 x (3 + 1) keys = 128
    assert attention_flops(TINY, [3]).tolist() == [128.0]
    assert flops_per_token(TINY, 3, with_lm_head=False) == 2 * 288 + 128
    assert lm_head_flops(TINY) == 2 * 4 * 10
    assert flops_per_token(TINY, 3, with_lm_head=True) == 2 * 288 + 128 + 80
    # lm_head on 2 of 10 computed positions only
    assert workload_flops(TINY, 10, 3, 2) == 10 * 704 + 2 * 80


def test_per_weight_split_on_a_grouped_query_shape():
    # d_model 10; 4 query heads of head_dim 3 (q width 12, not d_model), 2 KV heads (k/v width 6); d_ff 7
    shape = ModelShape(n_layer=3, d_model=10, n_head=4, n_kv_head=2, head_dim=3, d_ff=7, n_vocab=11)
    split = layer_weight_params(shape)
    assert split == {"q": 10 * 12, "k": 10 * 6, "v": 10 * 6, "o": 12 * 10, "gate": 10 * 7, "up": 10 * 7,
                     "down": 7 * 10}
    assert tuple(split) == WEIGHTS
    assert layer_matmul_params(shape) == 120 + 60 + 60 + 120 + 3 * 70
    # TINY (1 KV head of 2, q width 4): q 16, k 8, v 8, o 16, MLP 3 x 32
    assert layer_weight_params(TINY) == {"q": 16, "k": 8, "v": 8, "o": 16, "gate": 32, "up": 32, "down": 32}


def test_smollm2_135m_parameter_count():
    # 30 x (576*576*2 + 2*576*192 + 3*576*1536) = 106,168,320; plus the tied 576 x 49152 embedding = 134.5M
    assert non_embedding_params(SMOLLM2_135M) == 106_168_320
    assert non_embedding_params(SMOLLM2_135M) + 576 * 49152 == pytest.approx(134.5e6, rel=1e-3)


def test_shape_from_hf_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 8, "vocab_size": 10}))
    shape = shape_from_hf_config(tmp_path)
    assert (shape.n_layer, shape.d_model, shape.n_head, shape.n_kv_head, shape.head_dim, shape.d_ff, shape.n_vocab) == (
        2, 4, 2, 1, 2, 8, 10)


def test_median_and_ratio():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 0.0) is None
    assert target(9.0, 10.0) == {"value": 9.0, "target": 10.0, "met": False}
    assert target(None, 10.0)["met"] is None


def test_trie_positions_count_distinct_prefixes():
    seqs = [(1, 2, 3), (1, 2, 4), (1, 5)]
    positions = distinct_prefix_positions(seqs)
    assert sorted(positions.tolist()) == [0, 1, 1, 2, 2]  # nodes: 1 | 2, 5 | 3, 4
    assert all_positions(seqs).tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    a = [TokenRequest((1, 2, 3), 1)]
    assert requests_digest(a) == requests_digest([TokenRequest((1, 2, 3), 1)])
    assert requests_digest(a) != requests_digest([TokenRequest((1, 2, 3), 2)])


def _measured(shared_s: float, pp_s: float, alone_s: float) -> dict:
    stats = {"computed_tokens": 100, "forward_calls": 3}
    return {"trie_minimal_tokens": 100, "requested_tokens": 400, "scored_tokens": 20, "mean_trie_position": 3.0,
            "mean_request_position": 3.0, "shared_vs_per_request_max_abs_diff": 0.0, "max_rss_bytes": 2**20,
            "shared": {"seconds": shared_s, "stats": stats},
            "per_request": {"seconds": alone_s, "requests": 8, "requested_tokens": 400, "mean_position": 3.0,
                            "stats": {"computed_tokens": 400, "forward_calls": 8, "scored_tokens": 20}},
            "prefill": {"tokens": 50, "seconds": pp_s, "mean_position": 3.0}}


def test_backend_figures_ratios_on_crafted_numbers():
    fig = backend_figures(_measured(shared_s=2.0, pp_s=0.4, alone_s=8.0), TINY, sgemm_gflops=1e-6)
    assert fig["unique_tokens_per_s"] == 50.0
    assert fig["prefill_tokens_per_s"] == 125.0
    assert fig["unique_vs_prefill"] == pytest.approx(0.4)
    assert fig["sharing_speedup"] == 4.0
    # prefill: 50 tokens x 704 FLOPs + one lm_head row (80) in 0.4 s
    assert fig["prefill_gflops"] == pytest.approx((50 * 704 + 80) / 0.4 / 1e9)
    assert fig["prefill_fraction_of_sgemm"] == pytest.approx((50 * 704 + 80) / 0.4 / 1e9 / 1e-6)
    # shared: 100 computed x 704 + 20 scored rows x 80 in 2 s, against the prefill's FLOP/s above
    assert fig["shared_vs_prefill_gflops"] == pytest.approx(((100 * 704 + 20 * 80) / 2.0) / ((50 * 704 + 80) / 0.4))
    assert fig["max_rss_mb"] == 1.0
    # roofline: the 100 trie-minimal tokens x 704 + 20 lm_head rows x 80 at 1e-6 GFLOP/s (= 1000 FLOP/s), over 2 s
    assert fig["roofline_seconds"] == pytest.approx((100 * 704 + 20 * 80) / 1e3)
    assert fig["shared_fraction_of_roofline"] == pytest.approx((100 * 704 + 20 * 80) / 1e3 / 2.0)


def _e2e(seconds: float, logprobs: list[float], mode: str = "shared") -> dict:
    return {"seconds": seconds, "logprobs": logprobs, "mode": mode, "one_request_per_call": mode == "one_request_per_call",
            "weights": "w"}


def test_end_to_end_ratios_against_both_transformers_peers():
    from fastscore.bench.figures import _end_to_end

    e2e = {"llamacpp:q4_0": _e2e(1.0, [-1.0, -3.0]), "llamacpp:f32": _e2e(2.0, [-1.0, -2.0]),
           "onnx:fp32": _e2e(1.6, [-1.0, -2.5]), "reference:fp32": _e2e(40.0, [-1.0, -2.0], "one_request_per_call"),
           "reference:fp32:prefix_kv": _e2e(16.0, [-1.0, -2.0], "prefix_kv")}
    out = _end_to_end(e2e, "q4_0")
    assert out["speedup_vs_reference"] == 40.0 and out["max_abs_diff_best_vs_reference"] == 1.0
    assert out["fastest_exact"] == "onnx:fp32"
    assert out["exact_speedup_vs_prefix_kv"] == 10.0  # the fastest exact type (1.6 s) vs the peer (16 s)
    assert out["speedup_vs_prefix_kv llamacpp:f32"] == 8.0
    assert out["prefix_kv_speedup_vs_reference"] == 2.5
    assert out["max_abs_diff_prefix_kv_vs_reference"] == 0.0
    assert out["max_abs_diff_vs_reference onnx:fp32"] == 0.5
    from fastscore.bench.figures import _bounds

    backends = {"onnx:fp32": {"roofline_seconds": 2.0, "prefill_fraction_of_sgemm": 0.7}}
    bounds = _bounds({"backends": backends, "end_to_end": out})
    assert bounds["max_speedup_vs_prefix_kv_at_roofline"] == 8.0  # the peer's 16 s over the 2 s roofline
    assert bounds["prefill_fraction_of_sgemm"] == {"onnx:fp32": 0.7}


def test_greedy_vs_prefill_uses_the_best_batch_of_32_or_more():
    from fastscore.bench.figures import _greedy, _targets

    def run(tps: float) -> dict:
        return {"new_tokens": 4, "batched": {"tokens_per_s": tps, "prefill_seconds": 1.0},
                "sequential": {"tokens_per_s": 10.0, "prefill_seconds": 1.0}}

    greedy = _greedy({"8": run(90.0), "32": run(60.0), "64": run(85.0), "max_rss_bytes": 1}, "f32", 100.0)
    assert greedy["32"]["batched_vs_prefill"] == 0.6
    targets = _targets({"end_to_end": {}, "backends": {}, "greedy": greedy})
    assert targets["greedy_vs_prefill"] == {"value": 0.85, "target": 0.8, "met": True}  # 8 contexts do not count
    assert targets["exact_speedup_vs_prefix_kv"]["met"] is None
    assert greedy["32"]["unified_tokens_per_s"] is None  # the comparison layout not measured: n/a, not 0


def test_greedy_compares_streams_with_the_unified_cache():
    from fastscore.bench.figures import _greedy

    run = {"new_tokens": 4, "batched": {"tokens_per_s": 120.0, "prefill_seconds": 1.0},
           "sequential": {"tokens_per_s": 10.0, "prefill_seconds": 1.0}}
    unified = {"32": {"new_tokens": 4, "batched": {"tokens_per_s": 40.0, "prefill_seconds": 1.0}}}
    greedy = _greedy({"32": run, "unified": unified}, "f32", 150.0)
    assert set(greedy) == {"32", "backend", "prefill_tokens_per_s"}
    assert greedy["32"]["unified_tokens_per_s"] == 40.0
    assert greedy["32"]["streams_vs_unified"] == 3.0


def test_prefix_kv_peer_shares_only_rows_no_score_needs():
    from fastscore.bench.prefix_kv import shared_prefix_length

    reqs = [TokenRequest((1, 2, 3, 4, 5), 4), TokenRequest((1, 2, 3, 6), 3), TokenRequest((1, 2, 3, 4, 7), 4)]
    assert shared_prefix_length(reqs) == 2  # 3 shared tokens, but position 2 predicts request 1's first scored token
    assert shared_prefix_length([TokenRequest((1, 2), 1), TokenRequest((3, 2), 1)]) == 0


def test_best_type_and_max_diff():
    backends = {"llamacpp:f32": _measured(4.0, 1, 1), "llamacpp:q4_0": _measured(1.0, 1, 1),
                "onnx:fp32": _measured(0.5, 1, 1)}
    assert best_llamacpp_type(backends) == "q4_0"  # ONNX is not a llama.cpp type
    assert max_abs_diff([1.0, -2.0], [1.5, -2.25]) == 0.5
    with pytest.raises(ValueError):
        max_abs_diff([1.0], [1.0, 2.0])


REQUIRED_KEYS = ("backends", "best_llamacpp_type", "end_to_end", "greedy", "memory_mb", "roofline", "sgemm", "targets",
                 "threads", "workload")


def _study_items(data_dir) -> list[str]:
    """bench's options for one item of the study's tools environment."""
    return ["--limit", "1", "--env", "tools", "--data", str(data_dir)]


def _run_bench(tmp_path, workload: list[str], extra: list[str], as_json: bool = False) -> tuple[dict, str]:
    """The bench run once on `workload` (its options) with --json-out: its printed short table (with as_json: the JSON
    line, the same as the file's), and the full figures from the JSON file."""
    from fastscore.cli import main

    json_out = tmp_path / "bench.json"
    args = ["bench", "throughput", *workload, "--backends", "llamacpp", "--quants", "q4_1",
            "--repeats", "1", "--set", "sgemm_n=128", "--threads", "2", "--json-out", str(json_out),
            *extra, *(["--json"] if as_json else [])]
    result = CliRunner().invoke(main, args)
    print(result.output)
    assert result.exit_code == 0, result.output
    summary = json.loads(json_out.read_text())
    for key in REQUIRED_KEYS:
        assert key in summary, key
    if as_json:
        assert json.loads(result.stdout) == summary  # stdout holds the one JSON line and nothing else (progress: stderr)
    else:
        _check_short_table(result.output, summary)
    b = summary["backends"]["llamacpp:q4_1"]
    assert b["trie_minimal_tokens"] < b["requested_tokens"]
    print("shared vs one request per call, max |diff| (nats/request):", b["shared_vs_per_request_max_abs_diff"])
    assert all(v > 0 for v in summary["memory_mb"].values())
    return summary, result.output


def _check_short_table(output: str, summary: dict) -> None:
    """The default output is a short table for people: no JSON, no internal targets, one row per backend:type."""
    assert len(output) < 2000 and "{" not in output and "target" not in output and "NOT met" not in output
    lines = output.splitlines()
    header = next(k for k, line in enumerate(lines) if line.startswith("backend:type"))
    assert "tokens/s shared" in lines[header] and "end to end s" in lines[header]
    row = lines[header + 2].split()
    assert row[0] == "llamacpp:q4_1"
    b = summary["backends"]["llamacpp:q4_1"]
    assert float(row[1].replace(",", "")) == pytest.approx(b["requested_tokens_per_s"], abs=0.5)
    assert row[3] == f"{b['sharing_speedup']:,.1f}x"


SMOKE_REQUEST = {"id": "one", "messages": [{"role": "system", "content": "You call tools."},
                                          {"role": "user", "content": "What is the weather in Paris?"}],
                 "candidates": ['{"name": "get_weather", "arguments": {"city": "Paris"}}',
                                '{"name": "get_weather", "arguments": {"city": "paris"}}',
                                '{"name": "get_time", "arguments": {"city": "Paris"}}', "I cannot tell."]}


def test_bench_smoke_tiny_sizes(tmp_path):
    """The shipped q4_1 GGUF on one context of 4 candidates: a short table, and every figure in the JSON. (A short
    requests file rather than a study item, whose tool schemas made the run ~40 s on a loaded 2-core machine: bench on
    the study's items runs in the slow test_bench_smoke_with_reference.)"""
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps(SMOKE_REQUEST) + "\n")
    summary, output = _run_bench(tmp_path, ["--requests", str(requests)], [
        "--skip-reference", "--set", "pp_tokens=16", "--set", "per_request_limit=1", "--set", "greedy_batches=1",
        "--set", "new_tokens=1"])
    assert summary["workload"]["requests"] == 4  # 1 context x 4 candidates
    assert summary["backends"]["llamacpp:q4_1"]["per_request_requests"] == 1
    build = summary["backends"]["llamacpp:q4_1"]["llamacpp_build"]  # the worker's own llama.cpp, not the parent's
    assert "CPU" in build["ggml_backends"] and f"ggml backends {', '.join(build['ggml_backends'])}" in output
    assert summary["end_to_end"]["llamacpp:q4_1"]["requests"] == 4
    assert "speedup_vs_reference" not in summary["end_to_end"]
    assert summary["targets"]["end_to_end_speedup"]["met"] is None  # not measured: n/a, never a made-up value
    assert set(summary["greedy"]) == {"1", "backend", "prefill_tokens_per_s"}
    assert summary["greedy"]["1"]["batched_vs_prefill"] > 0
    assert summary["greedy"]["1"]["unified_tokens_per_s"] > 0  # measured side by side in the same run


@pytest.mark.slow
def test_bench_smoke_with_reference(tmp_path, study_data):
    """Adds the transformers reference (end-to-end speedup, max difference) and batched greedy decoding; --json."""
    summary, _ = _run_bench(tmp_path, _study_items(study_data), ["--set", "conditions=before,after",
                                                                 "--set", "pp_tokens=64", "--set", "greedy_batches=1,2",
                                                                 "--set", "new_tokens=2"], as_json=True)
    assert summary["workload"]["requests"] == 8  # 1 item x (before, after) x 4 candidates
    e2e = summary["end_to_end"]
    assert e2e["llamacpp:q4_1"]["requests"] == e2e["reference:fp32"]["requests"] == 8
    assert e2e["reference:fp32:prefix_kv"]["requests"] == 8
    print("q4_1 vs reference max |diff| (nats/request):", e2e["max_abs_diff_best_vs_reference"])
    # The peer reusing each context's KV computes the same numbers as the plain reference.
    assert e2e["max_abs_diff_prefix_kv_vs_reference"] <= 1e-3
    assert np.isfinite(e2e["speedup_vs_reference"])
    assert set(summary["greedy"]) >= {"1", "2"}


def test_prefix_kv_peer_equals_the_reference_on_a_tiny_model(tiny_artefact):
    """The peer reuses each set's prefix KV and crops it back after every candidate: same numbers as scoring each
    request whole."""
    from fastscore.backends import load
    from fastscore.bench.prefix_kv import score_set_with_prefix_kv

    artefact = tiny_artefact("llama", "reference", "fp32")
    stem = tuple(range(5, 40))
    requests = [TokenRequest(stem + tail, len(stem)) for tail in ((7, 8, 9), (7, 3), (11, 12, 13, 14))]
    with load("reference", artefact.path, n_threads=1) as backend:
        want = [float(np.sum(s.logprobs)) for s in backend.score_tokens(requests)]
        got = score_set_with_prefix_kv(backend.model, backend.torch, requests)
        again = score_set_with_prefix_kv(backend.model, backend.torch, requests[::-1])[::-1]
    assert np.abs(np.subtract(got, want)).max() <= 1e-4
    assert np.abs(np.subtract(again, want)).max() <= 1e-4


def test_set_parses_the_measurement_sizes_and_refuses_the_rest():
    from fastscore.bench.settings import parse_settings
    from fastscore.errors import RequestError

    assert parse_settings(["pp_tokens=16", "greedy-batches=1, 8", "conditions=before,after", "sgemm_n=128"]) == {
        "pp_tokens": 16, "greedy_batches": (1, 8), "conditions": ("before", "after"), "sgemm_n": 128}
    for bad, why in (("threads=2", "KEY one of"), ("pp_tokens", "KEY one of"), ("pp_tokens=1", "at least 2"),
                     ("new_tokens=1,2", "one number"), ("greedy_batches=0", "at least 1"), ("sgemm_n=x", "whole")):
        with pytest.raises(RequestError, match=why):
            parse_settings([bad])


def test_the_bench_group_keeps_the_old_invocations():
    """`fastscore bench OPTIONS` is `bench throughput OPTIONS`; the investigations' flags name their scripts; the old
    command names still run, with a note naming the new one."""
    from fastscore.cli import main

    runner = CliRunner()
    bare = runner.invoke(main, ["bench", "--set", "nope=1"])  # only throughput has --set: it was routed there
    assert bare.exit_code == 6 and "--set 'nope=1'" in bare.output, bare.output
    for flag, script in (("--decode-bound", "fastscore.bench.lab.decode_bound"),
                         ("--op-profile", "fastscore.bench.lab.op_profile"),
                         ("--study-bound=x", "fastscore.bench.lab.study_bound")):
        moved = runner.invoke(main, ["bench", "--limit", "1", flag])
        assert moved.exit_code == 2 and f"python -m {script}" in moved.output, moved.output
    listed = runner.invoke(main, ["--help"]).output
    assert "bench-scale" not in listed and "quant-check" not in listed  # hidden: the group lists the new names
    for old, new in (("bench-scale", "scale"), ("quant-check", "quant")):
        renamed = runner.invoke(main, [old, "--model" if old == "quant-check" else "--models", "nope-model"])
        assert f"`fastscore {old}` is now `fastscore bench {new}`" in renamed.output, renamed.output
        assert renamed.exit_code == 2 and "unknown model 'nope-model'" in renamed.output
