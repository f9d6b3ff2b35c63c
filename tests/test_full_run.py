"""The committed full run (results/smollm2-135m-full, docs/full-run.md) reproduces from its rows, and the README's
paper-vs-study table is the one its summary gives.

CI re-scores 2 committed items (one per environment) from scratch with the running code
(`study-shards verify --item mbpp-775 --item tools:simple_python_243`): every score
within 1e-4 nats of the committed rows, every text, greedy completion and verdict equal. A change that moves the
study's numbers fails here, so it cannot land beside rows it no longer reproduces.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from fastscore.cli import main

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "results" / "smollm2-135m-full"


def test_the_full_run_is_committed_with_its_manifest_and_rows():
    assert (RUN / "manifest.json").is_file(), f"no committed full run at {RUN}"
    assert any((RUN / "rows").rglob("scores.parquet")), "the full run holds no committed shard"


def test_two_committed_items_re_score_to_their_rows(study_data, smollm_artefact):
    smollm_artefact("llamacpp", "f32")  # the exact default the rows were scored with (converted once per session)
    # Two named items, one per environment, with short greedy completions: a seeded sample would change as shards are
    # committed, and an MBPP item decoding to its 300-token cap made this the suite's slowest test.
    result = CliRunner().invoke(main, ["study-shards", "verify", str(RUN), "--item", "mbpp-775",
                                       "--item", "tools:simple_python_243", "--data", str(study_data)])
    print(result.output)
    assert result.exit_code == 0, result.output
    assert "reproduced: every score within 0.0001 nats" in result.output


def test_verify_refuses_an_item_no_committed_shard_holds(study_data):
    result = CliRunner().invoke(main, ["study-shards", "verify", str(RUN), "--item", "mbpp-775", "--item", "no-such-item",
                                       "--data", str(study_data)])
    assert result.exit_code != 0
    assert "no committed shard" in result.output and "item(s) no-such-item" in result.output, result.output


def test_the_readme_table_is_the_one_the_committed_summary_gives():
    result = CliRunner().invoke(main, ["study-table", str(RUN), "--check", str(ROOT / "README.md")])
    assert result.exit_code == 0, result.output


def test_the_committed_run_resumes_under_the_codes_settings():
    """`study-shards run` refuses a run made under other settings: a changed default (a new setting, another
    --retries) must come with the committed manifest's settings updated where no committed row depends on them."""
    from fastscore.study.shards.manifest import Manifest
    from fastscore.study.shards.run import config_from_manifest

    manifest = Manifest.open(RUN, None)
    now = config_from_manifest(manifest, RUN).settings()
    differing = {k: (manifest.settings.get(k), now.get(k)) for k in set(manifest.settings) | set(now)
                 if manifest.settings.get(k) != now.get(k)}
    assert not differing, f"the committed run's settings differ from the code's (was, now): {differing}"
