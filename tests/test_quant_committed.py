"""`fastscore bench quant --run`: quantisation checked on a sharded run's committed items against its rows.

The run is a tiny committed one (the tiny random Llama through llama.cpp f32, tools, 2-item shards, 6 greedy tokens,
as in test_study_shards): the run's own type scored as a "variant" must reproduce its rows, a quantised type gives
n and CIs per source and environment, and a run without committed rows is refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fastscore.cli import main
from fastscore.errors import DataError
from fastscore.study.shards.manifest import Manifest, sha256_file
from fastscore.study.shards.rescore import TOLERANCE
from fastscore.study.shards.rowfiles import read_rows, write_rows
from fastscore.study.shards.run import ShardRunConfig, run_shards


@pytest.fixture(scope="module")
def run(tiny_model, study_data, tmp_path_factory) -> Path:
    """A committed run: seeded/tools/00000 and 00001 (2 items each) and model/tools/00000 (no item: the tiny
    model's attempts are cut off at 6 tokens)."""
    out = tmp_path_factory.mktemp("quant-run") / "run"
    config = ShardRunConfig(out_dir=out, data_dir=study_data, shard_items=2, model=str(tiny_model("llama")),
                            envs=("tools",), max_new_tokens=6, threads=1, max_shards=3)
    outcome = run_shards(config)
    assert outcome.ran == ("seeded/tools/00000", "model/tools/00000", "seeded/tools/00001")
    return out


def _check(run: Path, out: Path, data: Path, *options: str):
    args = ["bench", "quant", "--run", str(run), "--out", str(out), "--data", str(data), "--threads", "1",
            "--n-boot", "200", *options]
    result = CliRunner().invoke(main, args)
    print(result.output)
    return result


def test_the_run_s_own_type_reproduces_its_committed_rows(run, tmp_path, study_data):
    result = _check(run, tmp_path / "out", study_data, "--variants", "llamacpp:f32")
    assert result.exit_code == 0, result.output + repr(result.exception)
    summary = json.loads((tmp_path / "out" / "quant.json").read_text())
    groups = summary["variants"]["llamacpp:f32"]["groups"]
    assert set(groups) == {"all", "seeded/tools"} and groups["all"]["n"] == 4 == summary["items"]["all"]
    per_item = summary["per_item"]
    max_lp = max(max(abs(r["lp_before"] - r["lp_before_committed"]), abs(r["lp_after"] - r["lp_after_committed"]))
                 for r in per_item)
    print(f"max |Δ lp| f32 vs its committed rows: {max_lp:.3g}; max |ΔG| {groups['all']['max_abs_gain_diff']:.3g}")
    assert max_lp <= TOLERANCE
    assert groups["all"]["sign_agreement"]["mean"] == 1.0
    assert abs(groups["all"]["shift_gain_per_token"]["mean"]) <= TOLERANCE
    assert groups["all"]["argmax_agreement_after"]["mean"] == 1.0
    assert {r["item_id"] for r in per_item} == {r["item_id"] for r in _committed_items(run)}


def _committed_items(run: Path) -> list[dict]:
    return [r for f in sorted(run.glob("rows/seeded/tools/shard-*/items.parquet")) for r in read_rows(f)]


def test_a_quantised_type_gives_n_and_intervals_on_a_seeded_sample(run, tmp_path, study_data):
    result = _check(run, tmp_path / "out", study_data, "--variants", "llamacpp:q8_0", "--sample", "3",
                    "--seed", "1")
    assert result.exit_code == 0, result.output + repr(result.exception)
    summary = json.loads((tmp_path / "out" / "quant.json").read_text())
    c = summary["variants"]["llamacpp:q8_0"]["groups"]["seeded/tools"]
    print(f"q8_0 vs committed f32: max |ΔG| {c['max_abs_gain_diff']:.3g}, shift {c['shift_gain_per_token']}")
    assert c["n"] == 3 and summary["items"]["sample"] == 3
    for key in ("sign_agreement", "shift_gain_per_token"):
        e = c[key]
        assert e["n"] == 3 and e["lo"] <= e["mean"] <= e["hi"], (key, e)
    assert 0.0 < c["max_abs_gain_diff"]  # quantised weights move the scores: this is not the run's own type
    markdown = (tmp_path / "out" / "quant.md").read_text()
    assert "| llamacpp:q8_0 | seeded/tools | 3 |" in markdown and "committed rows" in markdown
    again = _check(run, tmp_path / "again", study_data, "--variants", "llamacpp:q8_0", "--sample", "3", "--seed", "1")
    assert json.loads((tmp_path / "again" / "quant.json").read_text())["per_item"] == summary["per_item"]


def test_a_stopped_check_resumes_from_its_kept_calls_and_refuses_calls_of_other_weights(run, tmp_path, study_data):
    out = tmp_path / "out"
    assert _check(run, out, study_data, "--variants", "llamacpp:q8_0").exit_code == 0
    first = json.loads((out / "quant.json").read_text())["per_item"]
    calls = out / "calls" / "llamacpp-q8_0.jsonl"
    header, *lines = calls.read_text().splitlines()
    # one call per shard here (2 items each): a call never mixes shards, so adding shards changes no call
    assert [{key[0] for key in json.loads(line)["items"]} for line in lines] == [
        {"seeded/tools/00000"}, {"seeded/tools/00001"}]
    # stopped half way through writing the second call: the first is read back (marked), the second scored again
    marked = json.loads(lines[0])
    marked["lp_before"] = [x - 1.0 for x in marked["lp_before"]]
    calls.write_text("\n".join([header, json.dumps(marked), lines[1][: len(lines[1]) // 2]]))
    assert _check(run, out, study_data, "--variants", "llamacpp:q8_0").exit_code == 0
    again = {r["item_id"]: r for r in json.loads((out / "quant.json").read_text())["per_item"]}
    kept = {key[1] for key in marked["items"]}
    for row in first:
        shift = 1.0 if row["item_id"] in kept else 0.0
        assert again[row["item_id"]]["lp_before"] == pytest.approx(row["lp_before"] - shift, abs=1e-9)
    assert len(calls.read_text().splitlines()) == 3  # the cut line was dropped and the call written whole
    # a call is named by its items' scored tokens too: other tokens under the same item ids miss the kept call
    other = json.loads(calls.read_text().splitlines()[1])
    other["items"] = [[shard, item_id, "0" * 16] for shard, item_id, _ in other["items"]]
    other["lp_before"] = [x - 5.0 for x in other["lp_before"]]
    calls.write_text("\n".join([header, json.dumps(other)]) + "\n")
    assert _check(run, out, study_data, "--variants", "llamacpp:q8_0").exit_code == 0
    assert json.loads((out / "quant.json").read_text())["per_item"] == first
    calls.write_text(calls.read_text().replace('"weights": "', '"weights": "other '))
    result = _check(run, out, study_data, "--variants", "llamacpp:q8_0")
    assert result.exit_code == DataError.exit_code and "scores of other weights" in result.output


def test_a_run_without_committed_rows_is_refused(run, tmp_path, study_data):
    empty = tmp_path / "empty"
    empty.mkdir()
    Manifest(empty, {**Manifest.open(run, None).record, "shards": {}}).save()  # planned, no shard committed
    result = _check(empty, tmp_path / "out", study_data)
    assert result.exit_code == DataError.exit_code
    assert "has no committed rows" in result.output
    assert not (tmp_path / "out" / "quant.json").exists()


def _recommit(run: Path, kind: str, change) -> None:
    """Change the rows of one kind of seeded/tools/00000 and record them in the manifest (a consistent commit of
    rows the code did not make)."""
    manifest = json.loads((run / "manifest.json").read_text())
    entry = manifest["shards"]["seeded/tools/00000"]["files"][kind]
    rows = read_rows(run / entry["file"])
    change(rows)
    write_rows(run / entry["file"], rows)
    entry["sha256"] = sha256_file(run / entry["file"])
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_the_check_sees_rows_that_differ_and_refuses_rows_of_other_tokens(run, tmp_path, study_data):
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".scratch", ".fastscore.lock*"))
    first = read_rows(copy / "rows/seeded/tools/shard-00000/items.parquet")[0]["item_id"]

    gains = []

    def flip(rows):  # the first item's committed G turns into -G
        lp = {r["condition"]: r["lp"] for r in rows if r["item_id"] == first}
        gains.append(lp["before"] - lp["after"])
        for row in rows:
            if row["item_id"] == first and row["condition"] == "after":
                row["lp"] = 2 * lp["before"] - lp["after"]

    _recommit(copy, "scores", flip)
    result = _check(copy, tmp_path / "out", study_data, "--variants", "llamacpp:f32")
    assert result.exit_code == 0, result.output + repr(result.exception)
    c = json.loads((tmp_path / "out" / "quant.json").read_text())["variants"]["llamacpp:f32"]["groups"]["all"]
    print(f"committed G {gains[0]:.3f} of one item turned into its negative: max |dG| {c['max_abs_gain_diff']:.3g}, "
          f"sign agreement {c['sign_agreement']}")
    assert gains[0] != 0.0
    assert c["sign_agreement"]["mean"] == 3 / 4
    assert abs(c["max_abs_gain_diff"] - 2 * abs(gains[0])) <= TOLERANCE

    def retoken(rows):
        for row in rows:
            if row["item_id"] == first:
                ids = row["conditions"]["after"]["cand_token_ids"][1]
                ids[0] = ids[0] + 1

    _recommit(copy, "logprobs", retoken)
    result = _check(copy, tmp_path / "again", study_data, "--variants", "llamacpp:f32")
    assert result.exit_code == DataError.exit_code
    assert "score other tokens than the committed rows" in result.output


def test_an_item_the_run_could_not_score_is_left_out_and_named(run, tmp_path, study_data):
    """An item the run recorded an item error for (as the full run's mbpp-493, too long for n_ctx) has no rows: the
    check leaves it out, says so, and samples only from the items the run scored."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".scratch", ".fastscore.lock*"))
    first = read_rows(copy / "rows/seeded/tools/shard-00000/items.parquet")[0]["item_id"]

    def drop(rows):
        rows[:] = [r for r in rows if r["item_id"] != first]

    _recommit(copy, "scores", drop)
    _recommit(copy, "logprobs", drop)
    manifest = json.loads((copy / "manifest.json").read_text())
    errors = copy / "rows/seeded/tools/shard-00000/item_errors.parquet"
    write_rows(errors, [{"item_id": first, "env": "tools", "stage": "score", "reason": "context too long for the model",
                         "detail": "crafted"}])
    manifest["shards"]["seeded/tools/00000"]["files"]["item_errors"] = {
        "file": errors.relative_to(copy).as_posix(), "sha256": sha256_file(errors), "n": 1}
    (copy / "manifest.json").write_text(json.dumps(manifest))

    for options, n in ((), 3), (("--sample", "3", "--seed", "0"), 3):
        out = tmp_path / f"out{len(options)}"
        result = _check(copy, out, study_data, "--variants", "llamacpp:f32", *options)
        assert result.exit_code == 0, result.output + repr(result.exception)
        summary = json.loads((out / "quant.json").read_text())
        assert summary["items"]["all"] == n and first not in {r["item_id"] for r in summary["per_item"]}
        assert summary["left_out_item_errors"] == [f"seeded/tools/00000:{first}"]
        assert f"Left out: 1 committed item(s) the run recorded an item error for" in (out / "quant.md").read_text()


def test_options_that_pick_other_items_are_refused_with_run(tmp_path):
    runner = CliRunner()
    for extra in (["--limit", "3"], ["--env", "tools"], ["--requests", str(tmp_path / "r.jsonl")]):
        (tmp_path / "r.jsonl").write_text("")
        result = runner.invoke(main, ["bench", "quant", "--run", str(tmp_path), *extra])
        assert result.exit_code == 2 and "--run" in result.output, (extra, result.output)
    result = runner.invoke(main, ["bench", "quant", "--sample", "3"])
    assert result.exit_code == 2 and "needs --run" in result.output


def _with_other_template(source: Path) -> Path:
    """The checkpoint with one more newline after each message: the same weights, other tokens (kept in the cache, as
    its conversions are)."""
    from fastscore import cache

    final = cache.home() / "test-models" / f"{source.name}-double-newline"
    if not cache.is_complete(final):
        with cache.atomic_dir(final) as scratch:
            shutil.copytree(source, scratch, dirs_exist_ok=True)
            config = json.loads((scratch / "tokenizer_config.json").read_text())
            end = "'<|im_end|>' + '\n'"  # a newline inside the template's string literal
            assert end in config["chat_template"]
            (scratch / "chat_template.jinja").write_text(config.pop("chat_template").replace(end, end + " + '\n'"))
            (scratch / "tokenizer_config.json").write_text(json.dumps(config))
    return final


def test_a_variant_that_tokenizes_the_requests_differently_is_refused(run, tiny_model, tmp_path, study_data):
    # The CLI refuses another model outright (next test); the tokenization check guards a variant of the run's own
    # model whose conversion renders other tokens, simulated here with the same weights under another template.
    from fastscore.selection import ModelSelection
    from fastscore.study.quantcheck.committed import load_committed_items, reference_tokens, score_committed
    from fastscore.variants import get

    other = _with_other_template(tiny_model("llama"))
    items, settings, _ = load_committed_items(run, study_data)
    own = ModelSelection.resolve(settings["model"], "llamacpp", "f32", threads=1)
    ref_tokens = reference_tokens(own, items, settings["include_end_of_turn"])
    variant = get("llamacpp", "f32")
    with pytest.raises(DataError, match="differently from the run's model") as caught:
        score_committed(variant, ModelSelection.resolve(str(other), "llamacpp", "f32", threads=1), items,
                        settings["include_end_of_turn"], ref_tokens, False)
    print(caught.value)
    assert "tokenizes seeded/tools item" in str(caught.value)


def test_another_models_variants_are_refused_against_the_runs_rows(run, tmp_path, study_data):
    result = _check(run, tmp_path / "out", study_data, "--model", "smollm2-360m-instruct")
    assert result.exit_code == DataError.exit_code, result.output
    assert "its rows are no reference for 'smollm2-360m-instruct'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
