"""The llama.cpp op profile: classification and gap maths on crafted numbers, and a profile of a tiny random model
whose node counts per kind follow from its architecture (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fastscore.bench.lab.op_kinds import (
    GAP_GROUPS,
    KINDS,
    aggregate,
    classify,
    gap_breakdown,
    group_rows,
    matmul_flops,
    mean_totals,
    needed_flops,
)
from fastscore.bench.roofline import ModelShape, workload_flops
from fastscore.variants import BATCH_INVARIANCE_TOL

TINY = ModelShape(n_layer=2, d_model=4, n_head=2, n_kv_head=1, head_dim=2, d_ff=8, n_vocab=10)


def test_nodes_are_classified_by_op_name_and_sources():
    assert classify("MUL_MAT", "Qcur-3", ["blk.3.attn_q.weight", "attn_norm-3"]) == "matmul q"
    assert classify("MUL_MAT", "ffn_down-0", ["blk.0.ffn_down.weight", "ffn_swiglu-0"]) == "matmul down"
    assert classify("MUL_MAT", "result_output", ["output.weight", "result_norm"]) == "lm_head"
    assert classify("MUL_MAT", "result_output", ["token_embd.weight", "result_norm"]) == "lm_head"  # tied
    assert classify("MUL_MAT", "kq-0", ["k-0", "q-0"]) == "attn KQ"
    assert classify("MUL_MAT", "kqv-0", ["v-0", "kq_soft_max-0"]) == "attn KQV"
    assert classify("SOFT_MAX", "kq_soft_max-0", ["kq-0", "kq_mask"]) == "attn softmax"
    assert classify("RMS_NORM", "norm-0", ["inp_embd"]) == "norm"
    assert classify("MUL", "attn_norm-0", ["norm-0", "blk.0.attn_norm.weight"]) == "norm"  # the gain
    assert classify("MUL", "ffn_out-0", ["a", "b"]) == "add/mul"
    assert classify("ROPE", "Qcur-0", ["Qcur-0 (reshaped)", "inp_pos"]) == "rope"
    assert classify("SET_ROWS", "k_cache_view-0", ["Kcur-0", "k_idxs"]) == "kv write"
    assert classify("GET_ROWS", "inp_embd", ["token_embd.weight", "inp_tokens"]) == "get_rows"
    assert classify("SWIGLU", "ffn_swiglu-0", ["ffn_gate-0", "ffn_up-0"]) == "activation"
    assert classify("CONT", "kqv_out-0", ["kqv-0 (permuted)"]) == "copy"
    assert classify("VIEW", "x", []) == "view"
    assert classify("ARGSORT", "x", []) == "other"
    assert matmul_flops("MUL_MAT", (6, 5, 1, 1), 4) == 2 * 4 * 30
    assert matmul_flops("ADD", (6, 5, 1, 1), 4) == 0


def test_aggregate_sums_each_kind():
    rows = {r.kind: r for r in aggregate(["matmul q", "norm", "matmul q"], [1.0, 2.0, 1.0], [4e9, 0.0, 4e9])}
    assert list(rows) == ["matmul q", "norm"]  # in KINDS order
    assert rows["matmul q"].nodes == 2 and rows["matmul q"].seconds == 2.0
    assert rows["matmul q"].gflops == pytest.approx(4.0) and rows["norm"].gflops is None
    assert rows["matmul q"].share == pytest.approx(0.5)
    with pytest.raises(ValueError):
        aggregate(["no such kind"], [1.0], [0.0])


def test_needed_flops_are_the_bench_roofline():
    positions = np.array([0, 1, 2, 3, 7])
    need = needed_flops(TINY, positions.size, float((positions + 1).sum()), 3)
    assert sum(need.values()) == pytest.approx(workload_flops(TINY, positions.size, positions.mean(), 3))


def test_needed_flops_per_kind_on_a_grouped_query_shape():
    # 3 layers, d_model 10, 4 query heads of 3 (q width 12), 2 KV heads (k/v width 6), d_ff 7, vocab 11; per layer
    # q 10x12 = 120, k = v 10x6 = 60, o 12x10 = 120, gate = up = down 10x7 = 70
    shape = ModelShape(n_layer=3, d_model=10, n_head=4, n_kv_head=2, head_dim=3, d_ff=7, n_vocab=11)
    need = needed_flops(shape, n_tokens=5, attended=15.0, lm_head_rows=2)
    assert need == {"matmul q": 2 * 3 * 120 * 5, "matmul k": 2 * 3 * 60 * 5, "matmul v": 2 * 3 * 60 * 5,
                    "matmul o": 2 * 3 * 120 * 5, "matmul gate": 2 * 3 * 70 * 5, "matmul up": 2 * 3 * 70 * 5,
                    "matmul down": 2 * 3 * 70 * 5,
                    # each product: 2 x 3 layers x 4 heads x 3 dims per attended cell, 15 cells
                    "attn KQ": 2 * 3 * 4 * 3 * 15, "attn KQV": 2 * 3 * 4 * 3 * 15,
                    "lm_head": 2 * 10 * 11 * 2}
    assert set(need) <= set(KINDS)


def test_mean_totals_sum_runs_then_divide():
    rows = [{"kind": "norm", "op": "RMS_NORM", "nodes": 3, "seconds": 1.0, "flops": 0.0},
            {"kind": "matmul q", "op": "MUL_MAT", "nodes": 2, "seconds": 4.0, "flops": 8.0},
            {"kind": "norm", "op": "MUL", "nodes": 3, "seconds": 0.5, "flops": 0.0},
            {"kind": "norm", "op": "RMS_NORM", "nodes": 3, "seconds": 2.0, "flops": 0.0},  # the second run
            {"kind": "matmul q", "op": "MUL_MAT", "nodes": 2, "seconds": 6.0, "flops": 8.0},
            {"kind": "norm", "op": "MUL", "nodes": 3, "seconds": 1.5, "flops": 0.0}]
    by_kind = mean_totals(rows, 2)
    assert list(by_kind) == [("norm",), ("matmul q",)]  # first appearance
    assert by_kind[("norm",)] == {"kind": "norm", "nodes": 6.0, "seconds": 2.5, "flops": 0.0}
    assert by_kind[("matmul q",)] == {"kind": "matmul q", "nodes": 2.0, "seconds": 5.0, "flops": 8.0}
    by_op = mean_totals(rows, 2, by=("kind", "op"))
    assert by_op[("norm", "MUL")] == {"kind": "norm", "op": "MUL", "nodes": 3.0, "seconds": 1.0, "flops": 0.0}
    assert by_op[("norm", "RMS_NORM")]["seconds"] == 1.5
    with pytest.raises(ValueError):
        mean_totals(rows, 0)


def test_op_rows_and_kind_totals_average_alike():
    from fastscore.bench.lab.op_figures import _op_rows, mean_kind_totals

    rng = np.random.default_rng(0)
    runs = [{"nodes": [{"phase": phase, "kind": kind, "op": op, "nodes": int(rng.integers(1, 9)),
                        "seconds": float(rng.uniform(0, 1)), "flops": 0.0}
                       for phase in ("scoring", "step") for kind, op in
                       (("norm", "RMS_NORM"), ("norm", "MUL"), ("matmul q", "MUL_MAT"), ("copy", "CONT"))]}
            for _ in range(3)]
    kinds, ops = mean_kind_totals(runs, "scoring"), _op_rows(runs, "scoring")
    assert [r["kind"] for r in ops] == ["matmul q", "norm", "norm", "copy"]  # KINDS order, then slowest first
    assert ops[1]["seconds"] >= ops[2]["seconds"]
    for kind, total in kinds.items():
        parts = [r for r in ops if r["kind"] == kind]
        assert sum(r["seconds"] for r in parts) == pytest.approx(total["seconds"])
        assert sum(r["nodes"] for r in parts) == pytest.approx(total["nodes"])
    want = sum(r["seconds"] for run in runs for r in run["nodes"] if r["phase"] == "scoring" and r["kind"] == "norm")
    assert kinds["norm"]["seconds"] == pytest.approx(want / 3)


def test_compare_layouts_closes_every_opened_backend(monkeypatch):
    """A backend that fails to open (here the second) must not leak those opened before it."""
    import fastscore.backends.llamacpp as llamacpp
    from fastscore.bench.lab.op_profile import compare_layouts
    from fastscore.errors import ModelLoadError

    opened, closed = [], []

    class FakeBackend:
        def __init__(self, path, threads, options, compact=None, check_compact=True):
            if opened:
                raise ModelLoadError("the second layout does not open")
            opened.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

        def close(self):
            closed.append(self)

    monkeypatch.setattr(llamacpp, "LlamaCppBackend", FakeBackend)
    monkeypatch.setattr(llamacpp, "llama_module", lambda: object())
    with pytest.raises(ModelLoadError):
        compare_layouts(Path("unused.gguf"), 1, ["first", "second"], [], [], 1, 1)
    assert len(opened) == 1 and closed == opened


def test_the_observed_backend_computes_from_the_weights_file_the_product_loads(monkeypatch):
    """The op profile measures the product's path: on f32 the compact file's weights decoded in each product."""
    import fastscore.backends.llamacpp as llamacpp
    from fastscore.bench.lab.op_capture import observed_backend

    seen = {}

    class FakeBackend:
        def __init__(self, path, threads, options, compact=None, check_compact=True):
            seen.update(path=path, compact=compact, check_compact=check_compact)

    monkeypatch.setattr(llamacpp, "LlamaCppBackend", FakeBackend)
    observed_backend(Path("model.gguf"), 1, None, object(), Path("compact.gguf"))
    # its bits were checked when the product's own backend opened it
    assert seen == {"path": Path("model.gguf"), "compact": Path("compact.gguf"), "check_compact": False}


def test_the_gap_is_split_without_remainder():
    totals = {"matmul q": {"seconds": 3.0, "flops": 6e9}, "attn KQ": {"seconds": 1.0, "flops": 2e9},
              "norm": {"seconds": 0.5, "flops": 0.0}}
    needed = {"matmul q": 4e9, "attn KQ": 1e9}
    gap = gap_breakdown(measured_seconds=6.0, decode_seconds=5.0, totals=totals, needed=needed, sgemm_gflops=1.0)
    assert gap["roofline_seconds"] == pytest.approx(5.0)
    assert gap["fraction_of_roofline"] == pytest.approx(5 / 6)
    rows = {r["kind"]: r for r in gap["rows"]}
    assert rows["matmul q"]["excess_seconds"] == pytest.approx(-1.0)  # faster than its FLOPs at the sgemm rate
    assert rows["matmul q"]["recompute_seconds"] == pytest.approx(2.0)
    assert rows["attn KQ"]["recompute_seconds"] == pytest.approx(1.0)  # masked cells: computed beyond the need
    assert rows["llama.cpp host"]["excess_seconds"] == pytest.approx(0.5)  # 5.0 in llama_decode - 4.5 in nodes
    assert rows["fastscore Python"]["excess_seconds"] == pytest.approx(1.0)
    assert sum(r["excess_seconds"] for r in gap["rows"]) == pytest.approx(6.0 - 5.0)
    assert sum(r["of_gap"] for r in gap["rows"]) == pytest.approx(1.0)
    assert gap["gap_to_target_seconds"] == pytest.approx(6.0 - 5.0 / 0.8)
    groups = group_rows(gap["rows"], GAP_GROUPS)
    assert sum(g["excess_seconds"] for g in groups) == pytest.approx(1.0)  # every kind in exactly one group
    grouped = [k for members in GAP_GROUPS.values() for k in members]
    assert sorted(grouped) == sorted([*KINDS, "llama.cpp host", "fastscore Python"])


@pytest.mark.slow  # a measuring tool's end-to-end run (make test-all)
def test_profiling_does_not_change_the_scores(tiny_artefact):
    pytest.importorskip("llama_cpp")
    from fastscore.backends.llamacpp import LlamaCppBackend, llama_module
    from fastscore.bench.lab.op_capture import NodeTimer, TimedLlama, observed_backend
    from fastscore.records import TokenRequest

    path = tiny_artefact("llama", "llamacpp", "f32").path
    rng = np.random.default_rng(0)
    stem = rng.integers(0, 500, size=40).tolist()
    requests = [TokenRequest(tuple(stem + rng.integers(0, 500, size=n).tolist()), 30) for n in (5, 9, 14)]
    with LlamaCppBackend(path, n_threads=2) as plain:
        want = [s.logprobs for s in plain.score_tokens(requests)]
    timer = NodeTimer()
    with observed_backend(path, 2, None, TimedLlama(llama_module(), eval_callback=timer.callback)) as profiled:
        got = [s.logprobs for s in profiled.score_tokens(requests)]
    timer.check()
    diff = max(float(np.abs(a - b).max()) for a, b in zip(got, want))
    print(f"max |profiled - plain| log-prob difference: {diff:.3g}")
    assert diff <= 1e-6
    assert sum(r["nodes"] for r in timer.rows()) > 0


@pytest.mark.slow  # a measuring tool's end-to-end run (make test-all)
def test_op_profile_of_a_tiny_model(tiny_model, study_data, tmp_path):
    from fastscore.bench.lab.op_profile import OpProfileOptions, run_op_profile
    from fastscore.bench.lab.op_profile_table import render
    from fastscore.conversion import tiny

    opts = OpProfileOptions(model=str(tiny_model("llama")), data_dir=study_data, items_per_env=1, envs=("tools",),
                            threads=2, repeats=1, decode_contexts=3, new_tokens=2, sgemm_n=128,
                            conditions=("before",), compare=((("n_ubatch", 64),),))
    result = run_op_profile(opts, scratch_dir=tmp_path)
    print(render(result))
    assert json.loads(json.dumps(result)) == result
    assert result["weights_file"] == result["gguf"]  # a tiny model has no compact weights file
    layers, head_dim = tiny.LAYERS, tiny.HIDDEN // tiny.HEADS

    scoring = result["scoring"]
    kinds = {k["kind"]: k for k in scoring["kinds"]}
    ub = scoring["attention"]["micro_batches"]  # one layer-0 KQ product per micro-batch
    assert ub >= 1
    for kind in ("matmul q", "matmul k", "matmul v", "matmul o", "matmul gate", "matmul up", "matmul down",
                 "attn KQ", "attn softmax", "attn KQV"):
        assert kinds[kind]["nodes"] == layers * ub, kind  # one per layer per micro-batch
    assert kinds["rope"]["nodes"] == 2 * layers * ub  # Q and K
    assert kinds["kv write"]["nodes"] == 2 * layers * ub  # K and V into the cache
    # attn_norm and ffn_norm per layer plus the output norm, each an RMS_NORM and the MUL by its gain
    assert kinds["norm"]["nodes"] == 2 * (2 * layers + 1) * ub
    assert kinds["lm_head"]["nodes"] == ub
    # Shapes read from ggml's tensors: every layer's q and k projections multiply every computed token (the last
    # layer's MLP runs on the logits rows only, so it is not asserted here).
    computed = scoring["computed_tokens"]
    assert kinds["matmul q"]["flops"] == layers * 2 * tiny.HIDDEN * tiny.HEADS * head_dim * computed
    assert kinds["matmul k"]["flops"] == layers * 2 * tiny.HIDDEN * tiny.KV_HEADS * head_dim * computed
    shapes = scoring["attention"]["micro_batch_shapes"]
    assert sum(s[1] * s[3] for s in shapes) == computed  # every computed token in one micro-batch
    assert all(s[0] % 64 == 0 and s[2] == tiny.HEADS for s in shapes)  # cells padded to 64 (llamacpp/0002), per head
    assert sum(r["excess_seconds"] for r in scoring["gap"]["rows"]) == pytest.approx(
        scoring["plain_seconds"] - scoring["gap"]["roofline_seconds"])

    steps = result["decode_steps"]
    assert steps["attention"]["micro_batches"] == 2  # one micro-batch per step: every stream's token together
    assert {s[1] * s[3] for s in steps["attention"]["micro_batch_shapes"]} == {3}  # 3 contexts, one token each
    step_kinds = {k["kind"]: k for k in steps["kinds"]}
    assert step_kinds["lm_head"]["flops"] == 2 * tiny.HIDDEN * result["shape"]["n_vocab"] * 3 * 2
    assert "CPU" in result["llamacpp_build"]["ggml_backends"]

    # Another layout, timed side by side: what it changed, the same tokens computed, the same log-probs (f32 is
    # batch-invariant: micro-batches of 64 tokens instead of 512 move nothing beyond float rounding).
    first, other = result["layouts"]
    assert first["changed"] == {} and other["changed"] == {"n_ubatch": 64}
    assert first["weights_file"] == other["weights_file"] == result["weights_file"]
    assert first["computed_tokens"] == other["computed_tokens"] == computed
    assert first["max_abs_logprob_diff_vs_first"] == 0.0 and other["max_abs_logprob_diff_vs_first"] <= BATCH_INVARIANCE_TOL
    assert other["scoring_speedup"] == pytest.approx(first["scoring_seconds"] / other["scoring_seconds"])


def test_the_op_profile_script_writes_the_json(tiny_model, study_data, tmp_path):
    """`python -m fastscore.bench.lab.op_profile` runs the profile with the given options: --decode-contexts is the
    number of contexts decoded."""
    from click.testing import CliRunner

    from fastscore.bench.lab.op_profile import cli

    json_out = tmp_path / "ops.json"
    result = CliRunner().invoke(cli(), ["--model", str(tiny_model("llama")), "--data", str(study_data), "--limit",
                                        "1", "--env", "tools", "--conditions", "before", "--threads", "1",
                                        "--repeats", "1", "--decode-contexts", "2", "--new-tokens", "2",
                                        "--sgemm-n", "64", "--json-out", str(json_out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(json_out.read_text())
    assert '"decoding"' not in result.output  # a table for people; the JSON only with --json
    assert summary["decoding"]["contexts"] == 2 and summary["options"]["threads"] == 1
    assert "where the time above the roofline goes" in result.output
