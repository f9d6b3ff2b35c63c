"""Real-size stand-ins and `fastscore bench scale`: the registry's configs, the sharded random-weight builder, how a
stand-in is named and refused, the per-step results file, and the projection's reading of a study's stage table.

Real-size builds and conversions are `slow`; the fast tests use a two-layer model with the same code paths."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fastscore import registry
from fastscore.cli import main
from fastscore.conversion import standin
from fastscore.errors import UnknownModelError, UnsupportedError
from fastscore.resolve import model_source

TINY_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 128, "vocab_size": 50_000, "tie_word_embeddings": True, "rope_theta": 1e6,
               "rms_norm_eps": 1e-6, "max_position_embeddings": 2048}


def _tiny_entry(architecture: str = "Qwen2ForCausalLM") -> registry.ModelEntry:
    # A vocabulary larger than the tokenizer's 49,152 ids, as every real registry model's is.
    return registry.ModelEntry(name="tiny-standin", hub_id="example/tiny", family="qwen2.5",
                               architecture=architecture, params=0, config=TINY_CONFIG)


@pytest.mark.parametrize("entry", [e for e in registry.all_models() if e.config], ids=lambda e: e.name)
def test_registry_configs_give_the_published_parameter_counts(entry):
    # The configs are typed in by hand: the parameter count they imply must be the model card's (to 0.1%).
    shapes = standin.parameter_shapes(standin.hf_config(entry, eos_id=2, pad_id=2))
    n_params = sum(math.prod(shape) for shape in shapes.values())
    assert abs(n_params / entry.params - 1) < 1e-3, (entry.name, n_params, entry.params)


def test_every_non_embedded_registry_model_has_a_config():
    assert [e.name for e in registry.all_models() if not e.embedded and not e.config] == []


def test_standin_is_sharded_keeps_the_real_vocab_and_loads(smollm_tokenizer_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    folder = standin.build_standin(_tiny_entry(), tmp_path / "a", smollm_tokenizer_dir, seed=0, shard_bytes=4_000_000)
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").is_file()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    assert model.config.vocab_size == 50_000 and model.config.fastscore_standin == standin.MARK
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as the real ones
    with torch.inference_mode():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 50_000) and torch.isfinite(logits).all()
    weight = model.model.layers[0].mlp.up_proj.weight
    assert 0.015 < float(weight.detach().std()) < 0.025  # the realistic init scale
    assert not torch.allclose(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    record = json.loads((folder / standin.RECORD).read_text())
    assert record["standin"] == standin.MARK and record["parameters"] == sum(p.numel() for p in model.parameters())
    # Seeded per tensor: a second build is identical, whatever the shard size.
    again = standin.build_standin(_tiny_entry(), tmp_path / "b", smollm_tokenizer_dir, seed=0)
    other = transformers.AutoModelForCausalLM.from_pretrained(str(again), dtype=torch.float32)
    assert torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_standin_names_its_cache_folder_and_weights_as_a_standin():
    from fastscore.conversion.pipeline import weights_note

    source = model_source("qwen3-0.6b@standin")
    assert source.standin and source.key == "qwen3-0.6b-standin-random" and source.entry.name == "qwen3-0.6b"
    assert standin.MARK in weights_note(source, "llamacpp", "f32")
    assert standin.MARK in standin.label("qwen3-0.6b@standin")
    assert not model_source("qwen3-0.6b").standin  # the real checkpoint keeps its own cache folder
    with pytest.raises(UnknownModelError, match="Did you mean"):
        model_source("qwen3-0.7b@standin")
    with pytest.raises(UnsupportedError, match="no architecture config"):
        model_source(f"{registry.default_model()}@standin")


def test_sweep_refuses_a_standin_without_the_flag(tmp_path):
    result = CliRunner().invoke(main, ["sweep", "--models", "qwen3-0.6b@standin", "--out", str(tmp_path / "s")])
    assert result.exit_code != 0
    assert "--allow-stand-ins" in result.output and not (tmp_path / "s").exists()


def test_sweep_summary_marks_standins(tmp_path):
    from fastscore.sweep.grid import Cell
    from fastscore.sweep.summary import summarise_cells, write_summary

    cell = Cell("qwen3-0.6b@standin", "llamacpp", "f32", "tools", "seeded")
    result = summarise_cells(tmp_path, {}, {("qwen3-0.6b@standin", "llamacpp:f32"): "cannot be obtained here: x"},
                             [cell], seed=0, n_boot=10)
    write_summary(tmp_path, result, {"command": "c", "seed": 0, "shard_size": 1, "limit": 1, "ran_on": "here"}, {})
    text = (tmp_path / "summary.md").read_text()
    assert "**Stand-ins:**" in text and f"qwen3-0.6b [{standin.MARK}] | llamacpp:f32" in text
    assert json.loads((tmp_path / "summary.json").read_text())["cells"][0]["standin"] is True


@pytest.mark.slow  # a measuring tool's end-to-end run (make test-all)
def test_bench_scale_records_each_step_once_with_its_memory(tiny_model, study_data, tmp_path):
    from fastscore.bench import projection
    from fastscore.bench.scale import SCORING, ScaleOptions, load_results, run_scale, step_names

    model = str(tiny_model("llama"))
    keep = ("convert-gguf-f32", "score-gguf-f32", "greedy-gguf-f32")
    opts = ScaleOptions(out_dir=tmp_path, data_dir=study_data, models=(model,), threads=1, repeats=1,
                        greedy_batch=2, new_tokens=4, skip=tuple(s for s in step_names() if s not in keep))
    run_scale(opts)
    results = load_results(tmp_path, model)
    steps = results["steps"]
    assert set(steps) == set(keep)  # the rest was left out this time, not recorded: a later run measures it
    for name in keep:
        assert "error" not in steps[name], steps[name]
        assert steps[name]["max_rss_bytes"] > 50e6 and steps[name]["cpu_seconds"] > 0
        assert len(steps[name]["load_average_before"]) == 3
    assert steps["convert-gguf-f32"]["check_passed"] is True and steps["convert-gguf-f32"]["bytes"] > 0
    rate = projection.rates(results, "llamacpp", "f32")
    assert rate["score_computed"] > 0 and rate["greedy_with_prefill"] > 0
    # CPU time is recorded beside wall time (a step's share of a busy core moves only the latter)
    assert rate["unique_cpu"] > 0 and rate["pp_cpu"] > 0 and rate["greedy_with_prefill_cpu"] > 0
    assert 0 < rate["score_core_share"] < 1.5  # one thread: CPU seconds about the wall seconds, or fewer
    # A rerun measures nothing that is recorded.
    stamps = {name: steps[name]["measured_at"] for name in keep}
    run_scale(opts)
    assert {name: load_results(tmp_path, model)["steps"][name]["measured_at"] for name in keep} == stamps
    table = projection.render([results], [], None, SCORING)
    assert "| llamacpp f32 |" in table and "llamacpp q8_0" not in table  # only what was measured has a row
    # printing the tables measures nothing, so it leaves the options the measurements ran with as they are
    options = (tmp_path / "options.json").read_text()
    run_scale(ScaleOptions(out_dir=tmp_path, data_dir=study_data, models=(model,), skip=("convert", "score", "greedy")))
    assert (tmp_path / "options.json").read_text() == options


def test_projection_reads_the_study_stage_table_as_the_study_writes_it(tmp_path):
    from fastscore.bench import projection
    from fastscore.study.report.document import _stage_timings

    seconds = {"load model": 1.0, "build items": 0.0, "score candidate sets": 100.0, "greedy decoding": 50.0}
    tokens = {"build items": 0, "score candidate sets": 4000, "greedy decoding": 1000}
    (tmp_path / "report.md").write_text("# x\n\n" + _stage_timings(seconds, tokens) + "\n\n## Items\n")
    table = projection.stage_table(tmp_path / "report.md")
    assert table["score candidate sets"] == (100.0, 4000) and table["load model"] == (1.0, None)
    work = {"stages": table, "items": {"tools": 10}, "skipped": {"tools": 10}}
    rate = {"score_computed": 40.0, "greedy_with_prefill": 20.0}
    assert projection.full_scale(work, {"tools": 100}) == 5.0
    assert np.isclose(projection.project_seconds(work, rate, 5.0), 5 * (4000 / 40 + 1000 / 20))


def _measured(seconds: float, pp_seconds: float, decode_tok_s: float, load: float, cpu: float | None) -> tuple[dict, dict]:
    """A score step and a greedy step as the bench worker records them (100 computed / 80 unique tokens, pp of 512;
    4 contexts x 8 new tokens after a 40-token prefill taking 1 s); `cpu`: CPU seconds per wall second, if recorded."""
    score = {"shared": {"seconds": seconds, "stats": {"computed_tokens": 100}}, "trie_minimal_tokens": 80,
             "prefill": {"tokens": 512, "seconds": pp_seconds}, "load_average_before": [load, 0.0, 0.0]}
    batched = {"tokens_per_s": decode_tok_s, "prefill_tokens": 40, "prefill_seconds": 1.0, "decode_seconds": 32 / decode_tok_s}
    if cpu is not None:
        score["shared"]["cpu_seconds"], score["prefill"]["cpu_seconds"] = seconds * cpu, pp_seconds * cpu
        batched["prefill_cpu_seconds"], batched["decode_cpu_seconds"] = cpu, 32 / decode_tok_s * cpu
    return score, {"4": {"contexts": 4, "new_tokens": 8, "batched": batched}}


def test_the_ratio_table_divides_each_type_by_the_same_models_f32_by_wall_and_cpu_time():
    from fastscore.bench import projection
    from fastscore.bench.scale import SCORING

    steps = {}
    for name, figures in {"gguf-f32": (2.0, 4.0, 16.0, 1.5, 0.5), "gguf-f16": (4.0, 2.0, 8.0, 3.0, 0.25),
                          "onnx-fp32": (1.0, 8.0, 32.0, 0.5, None)}.items():
        steps[f"score-{name}"], steps[f"greedy-{name}"] = _measured(*figures)
    only_f16 = {"score-gguf-f16": steps["score-gguf-f16"]}  # no f32 to compare with: no row
    results = [{"label": "m", "standin": True, "steps": steps}, {"label": "n", "standin": True, "steps": only_f16}]
    rows = projection.ratio_rows(results, SCORING)
    # f16 by wall: half the scoring rate, twice the pp rate, half the decode rate, 72 tokens in 1+4 s vs 1+2 s; it
    # had half f32's share of a core, so by CPU time it is twice each of those
    assert rows[2] == "| m | llamacpp f16 | 2.00 (4.00) | 0.50 (1.00) | 0.50 (1.00) | 0.60 (1.20) | 0.25 / 0.50 | 3.00 / 1.50 |"
    assert rows[3] == "| m | onnx fp32 | 0.50 | 2.00 | 2.00 | 1.50 | – / 0.50 | 0.50 / 1.50 |"  # no CPU time: wall only
    assert len(rows) == 4
    table = projection.render(results, [], None, SCORING)
    assert "type / f32" in table and "| m | llamacpp f16 | 256.0 | 20.0 (25.0) | 8.0 (14.4) | – / – | 80.0 (0.25) | 57.6 (0.25) |" in table
    # the greedy rate per CPU second too: a step's share of a core moves its wall rate (72 tokens in 1.25 CPU s of 5 s)
    assert "| m | onnx fp32 | 64.0 | 80.0 (100.0) | 32.0 (36.0) | – / – | – (–) | – (–) |" in table


def test_a_greedy_step_recorded_without_its_scoring_step_still_has_its_row():
    # e.g. a rerun of one model's greedy step alone (the 1.7B's f32, first measured at 0.13 of a core): recorded in
    # the results file, so the table shows it, with the scoring cells empty; a type with neither step has no row
    from fastscore.bench import projection
    from fastscore.bench.scale import SCORING

    _, greedy = _measured(2.0, 4.0, 16.0, 1.5, 0.5)
    results = [{"label": "m", "standin": True, "steps": {"greedy-gguf-f32": greedy}}]
    rows = projection.scoring_rows(results, SCORING)
    # 4 x 8 tokens decoded at 16 tok/s (2 s) after a 40-token prefill of 1 s: 72 tokens in 3 s, 1.5 CPU s
    assert rows[2:] == ["| m | llamacpp f32 | – | – | 16.0 (24.0) | – / – | – | 48.0 (0.50) |"]
    assert projection.rates(results[0], "llamacpp", "f32") is None  # the projection still needs the scoring rate


def test_the_projection_runs_at_the_rates_per_cpu_second_when_asked():
    # Rates measured on a shared machine: per CPU second is what a worker with its whole core would run at. The
    # real model's check compares its study run (here one thread) with the projection at the same basis.
    from fastscore.bench import projection
    from fastscore.bench.scale import SCORING

    score, greedy = _measured(2.0, 4.0, 16.0, 1.5, 0.5)  # half a core: 100 tokens in 2 s wall, 1 CPU s
    real = {"label": "real", "standin": False, "steps": {"score-gguf-f32": score, "greedy-gguf-f32": greedy}}
    no_cpu = dict(zip(("score-gguf-f32", "greedy-gguf-f32"), _measured(2.0, 4.0, 16.0, 1.5, None)))
    other = {"label": "other", "standin": True, "steps": no_cpu}
    work = {"failures": "seeded", "stages": {"score candidate sets": (100.0, 4000), "greedy decoding": (50.0, 1000)},
            "items": {"tools": 10}, "skipped": {"tools": 10}}
    rate = projection.rates(real, "llamacpp", "f32")
    # 4000 tokens at 50 tok/s (wall) or 100 (CPU); 1000 at 72 tokens / 3 s (wall) or / 1.5 CPU s
    assert np.isclose(projection.project_seconds(work, projection.on_basis(rate, "wall"), 1.0), 80 + 1000 / 24)
    assert np.isclose(projection.project_seconds(work, projection.on_basis(rate, "cpu"), 1.0), 40 + 1000 / 48)
    assert projection.on_basis(projection.rates(other, "llamacpp", "f32"), "cpu") is None
    cpu = projection.render([real, other], [work], {"tools": 100}, SCORING, basis="cpu", study_workers=1)
    assert "projected 61 s vs measured 150 s" in cpu and "per CPU second" in cpu
    assert "| other |" not in cpu.split("Projected full grid", 1)[1]  # no CPU time recorded: no projected row
    wall = projection.render([real, other], [work], {"tools": 100}, SCORING, basis="wall", study_workers=1)
    assert "projected 122 s vs measured 150 s" in wall and "| other | llamacpp f32 (exact default, fastest measured) |" in wall
    with pytest.raises(ValueError):
        projection.on_basis(rate, "cycles")


def test_the_fastest_type_is_the_one_with_the_least_projected_grid_time():
    # ONNX scores faster than llama.cpp but decodes slower (measured on the stand-ins): the scoring rate alone would
    # pick it, the projected grid (scoring and decoding stages) does not
    from fastscore.bench import projection
    from fastscore.bench.scale import SCORING

    steps = {}
    for name, figures in {"gguf-f32": (2.0, 4.0, 16.0, 1.5, 0.5), "onnx-fp32": (1.0, 4.0, 2.0, 1.5, 0.5)}.items():
        steps[f"score-{name}"], steps[f"greedy-{name}"] = _measured(*figures)
    res = {"label": "m", "standin": True, "steps": steps}
    work = {"failures": "seeded", "stages": {"score candidate sets": (100.0, 4000), "greedy decoding": (50.0, 1000)},
            "items": {"tools": 10}, "skipped": {"tools": 10}}
    assert projection.fastest_type(res, SCORING, "cpu") == ("onnx", "fp32")  # no study runs: the scoring rate
    assert projection.fastest_type(res, SCORING, "cpu", [work], {"tools": 100}) == ("llamacpp", "f32")
    real = {**res, "label": "real", "standin": False}  # a real model: the 135M's check and the scaled column
    table = projection.render([real], [work], {"tools": 100}, SCORING, basis="cpu")
    assert "| real | llamacpp f32 (exact default, fastest measured) |" in table and "| real | onnx fp32 (" not in table
    # the exact default that is also the fastest still counts in the machine's total (it was dropped once)
    assert "one after another on this machine:" in table and "(1 models)" in table


@pytest.fixture(scope="module")
def tiny_standin(smollm_tokenizer_dir, tmp_path_factory) -> Path:
    """A two-layer Qwen2 stand-in whose vocabulary (50,000) is larger than its tokenizer's, as every real one's is."""
    return standin.build_standin(_tiny_entry(), tmp_path_factory.mktemp("standin") / "tiny-qwen2-standin",
                                 smollm_tokenizer_dir, seed=0)


@pytest.mark.slow  # a measuring tool's end-to-end run (make test-all)
def test_a_vocabulary_larger_than_the_tokenizer_converts_to_gguf(tiny_standin):
    from fastscore.conversion.checks import CheckReport
    from fastscore.conversion.gguf_tokenizer import read_vocab
    from fastscore.resolve import resolve

    artefact = resolve(str(tiny_standin), "llamacpp", "f32", progress=False)
    assert len(read_vocab(artefact.path).tokens) == 50_000  # padded by the converter: the lm_head keeps its rows
    assert CheckReport.load(artefact.path.parent).passed


@pytest.mark.slow  # a measuring tool's end-to-end run (make test-all)
def test_onnx_export_and_int8_through_the_external_data_path(tiny_standin, tmp_path, monkeypatch):
    # Past 2 GB (Qwen3-0.6B and up) optimum writes the weights to model.onnx_data; forced here on a tiny model.
    from fastscore.conversion import hf_to_onnx
    from fastscore.conversion.checks import onnx_structure

    # Past the limit optimum's post-processing (tied-weight deduplication) fails, so it is skipped there: the limit
    # is lowered so this tiny model takes the path a 2.4 GB one does (no post-processing, external data).
    import onnx

    monkeypatch.setenv("FORCE_ONNX_EXTERNAL_DATA", "1")
    monkeypatch.setattr(hf_to_onnx, "_PROTOBUF_LIMIT", 0)
    fp32 = hf_to_onnx.export_onnx(tiny_standin, tmp_path / "fp32", "fp32")
    assert (fp32 / "model.onnx_data").stat().st_size > (fp32 / "model.onnx").stat().st_size
    assert "FLOAT" in onnx_structure(fp32, "fp32")
    graph = onnx.load(str(fp32 / "model.onnx"), load_external_data=False).graph
    assert hf_to_onnx.LOGITS_START in {i.name for i in graph.input}  # the lm-head slice found its MatMul
    int8 = hf_to_onnx.export_onnx(tiny_standin, tmp_path / "int8", "int8", fp32_dir=fp32)
    assert (int8 / "model.onnx_data").is_file() and "INT8" in onnx_structure(int8, "int8")


@pytest.mark.slow
def test_real_size_standin_past_2gb_converts_and_checks():
    # Qwen3-0.6B's fp32 weights (2.4 GB) pass the protobuf limit: the real external-data path, end to end.
    from fastscore.conversion.pipeline import convert

    results = convert("qwen3-0.6b@standin", gguf=["q8_0"], onnx=["fp32", "int8"], progress=False)
    assert all(r.check is None or r.check.passed for r in results)
    onnx_fp32 = next(r.path for r in results if r.variant == "onnx-fp32")
    assert (onnx_fp32 / "model.onnx_data").stat().st_size > 2e9
    assert standin.MARK in (onnx_fp32 / "config.json").read_text()


def test_standin_builder_frees_each_shard_once_written(smollm_tokenizer_dir, tmp_path, monkeypatch):
    # A 1.7B stand-in is 6.8 GB of fp32: a written shard's tensors must be gone before the next shard fills up.
    import gc
    import weakref

    written: list[list[weakref.ref]] = []
    write = standin._write_shard

    def write_and_watch(safetensors_torch, out_dir, tensors, index):
        gc.collect()
        alive = [ref for refs in written for ref in refs if ref() is not None]
        assert not alive, f"{len(alive)} tensors of earlier shards still in memory while writing shard {index}"
        write(safetensors_torch, out_dir, tensors, index)
        written.append([weakref.ref(t) for t in tensors.values()])

    monkeypatch.setattr(standin, "_write_shard", write_and_watch)
    standin.build_standin(_tiny_entry(), tmp_path / "s", smollm_tokenizer_dir, seed=0, shard_bytes=100_000)
    assert len(written) > 2
