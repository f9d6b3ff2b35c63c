"""fastscore.bench.lab.decode_bound on a tiny random model: what each cell decoded, the ratios and the byte model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fastscore.bench.lab.decode_bound import DecodeBoundOptions, attended_cells, parse_cell, run_decode_bound
from fastscore.bench.lab.decode_bound_table import render
from fastscore.conversion import tiny
from fastscore.errors import RequestError


def test_attended_cells_count_the_positions_the_steps_feed():
    # 4 steps feed positions 10, 11, 12 (the first token comes from the prefill): 11, 12, 13 cells, padded to 256.
    assert attended_cells(10, 4) == (12.0, 256.0)
    assert attended_cells(255, 3) == (256.5, 384.0)  # 256 cells, then 257 -> the second 256-cell block
    assert parse_cell("256x32") == (256, 32)
    with pytest.raises(RequestError):
        parse_cell("256")
    with pytest.raises(RequestError):
        DecodeBoundOptions(model="x", steps=1)


@pytest.mark.slow  # a measuring tool's end-to-end run (make test-all)
def test_decode_bound_on_a_tiny_model(tiny_model, tmp_path):
    from fastscore.deps import require

    opts = DecodeBoundOptions(model=str(tiny_model("llama")), lengths=(3, 300), streams=(2, 3), steps=2, threads=2,
                              repeats=1, pp_tokens=32, cores_cell=(5, 2))
    result = run_decode_bound(opts, scratch_dir=tmp_path)
    print(render(result))

    assert [(c["length"], c["streams"]) for c in result["cells"]] == [(3, 2), (3, 3), (300, 2), (300, 3)]
    assert "CPU" in result["llamacpp_build"]["ggml_backends"]  # which llama.cpp build measured (e.g. + BLAS)
    prefill = result["prefill"]
    assert prefill["tokens_per_s"] == pytest.approx(32 / prefill["seconds"])
    kv_cell = tiny.LAYERS * tiny.KV_HEADS * 2 * (tiny.HIDDEN // tiny.HEADS) * 4  # f32 K and V, every layer
    assert result["kv_bytes_per_cell"] == kv_cell
    for c in result["cells"]:
        # Counted from greedy_decode's results: every context generated all its tokens (no stop token), and the
        # decoder stepped once per token after the first (which comes from the prefill's logits).
        assert c["generated_tokens"] == c["streams"] * 2
        assert c["decode_step_tokens"] == c["streams"] * 1
        assert c["tokens_per_s"] == pytest.approx(c["decode_step_tokens"] / c["decode_seconds"])
        assert c["fraction_of_prefill"] == pytest.approx(c["tokens_per_s"] / prefill["tokens_per_s"])
        assert c["decoder_groups"] == 1
        # One step at position `length`: length + 1 cells hold tokens; llama.cpp attends 256-cell blocks.
        assert c["mean_cells"] == c["length"] + 1
        assert c["mean_cells_padded"] == (256 if c["length"] < 256 else 512)
        assert c["kv_bytes_per_step"] == c["streams"] * (c["length"] + 1) * kv_cell
        assert c["gb_per_s"] == pytest.approx((c["weights_bytes_per_step"] + c["kv_bytes_per_step"])
                                              / c["step_seconds"] / 1e9)

    # The tiny model ties its lm_head to the embedding: a step reads every tensor of the GGUF once.
    reader = require("gguf", "tokenizer").GGUFReader(result["gguf"])
    tensor_bytes = sum(int(t.n_elements) * 4 for t in reader.tensors)  # all f32
    assert result["tied"] and result["tensor_bytes_total"] == tensor_bytes
    assert result["weights_bytes_per_step"] == tensor_bytes
    assert result["lm_head_bytes"] == result["shape"]["n_vocab"] * tiny.HIDDEN * 4
    assert all(c["weights_bytes_per_step"] == tensor_bytes for c in result["cells"])

    cores = result["cores"]
    assert (cores["length"], cores["streams"], cores["processes"]) == (5, 2, 2)
    assert len(cores["processes_own_tokens_per_s"]) == 2
    assert cores["aggregate_vs_one_process"] == pytest.approx(
        cores["processes_aggregate_tokens_per_s"] / cores["one_process_tokens_per_s"])
    assert json.loads(json.dumps(result)) == result


@pytest.mark.slow  # the script's default grid (up to 128 streams of 256 positions); its figures on crafted numbers
# stay in the default suite (test_attended_cells_count_the_positions_the_steps_feed)
def test_the_decode_bound_script_writes_the_json(tiny_model, tmp_path):
    """`python -m fastscore.bench.lab.decode_bound` runs the default grid with the given model, threads and output
    (--json: the JSON on stdout)."""
    from fastscore.bench.lab.decode_bound import cli

    json_out = tmp_path / "decode.json"
    result = CliRunner().invoke(cli(), ["--model", str(tiny_model("llama")), "--threads", "1", "--repeats", "1",
                                        "--pp-tokens", "16", "--json-out", str(json_out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(json_out.read_text())
    assert summary == json.loads(result.output)  # --json: the one JSON line and nothing else
    assert summary["options"]["threads"] == 1 and summary["cores"] is None  # one thread: nothing to compare
    assert [(c["length"], c["streams"]) for c in summary["cells"]] == [(16, 32), (16, 64), (16, 128), (256, 32),
                                                                       (256, 64), (256, 128)]


def test_a_failing_worker_stops_the_one_waiting_for_it(tiny_model, tmp_path):
    """Concurrent decode workers meet at a barrier: when one fails, the other is stopped, not waited for."""
    from fastscore.bench.lab.decode_bound import WORKER_TASK, _together
    from fastscore.errors import BenchmarkError

    base = {"task": WORKER_TASK, "quant": "f32", "steps": 2, "repeats": 1, "cells": [[3, 2]], "pp_tokens": None,
            "threads": 1, "barrier": str(tmp_path), "parties": 2}
    specs = [{**base, "model": str(tiny_model("llama")), "label": "waits"},
             {**base, "model": str(tmp_path / "no-such-model"), "label": "fails"}]
    with pytest.raises(BenchmarkError, match="'fails' failed"):
        _together(specs, ["waits", "fails"], tmp_path)
    assert not (tmp_path / "waits.out.json").exists()  # stopped at the barrier: it never measured
