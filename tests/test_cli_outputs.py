"""Self-describing `score` outputs through the CLI: token ids, text pieces, ranks, top-k, candidate index, the
OUT.meta.json sidecar, CSV/Parquet tables; and the CLI conventions --version and -h."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from fastscore import __version__
from fastscore.cli import main
from fastscore.provenance import meta_path
from fastscore.tables import flatten, write_table

REQUESTS = [
    {"id": "q", "messages": [{"role": "user", "content": "What is the capital of France?"}],
     "candidates": ["Paris", "Lyon"]},
    {"id": 7, "prompt": "One, two,", "continuations": [" three", " four"]},
]


def test_version_and_short_help():
    runner = CliRunner()
    version = runner.invoke(main, ["--version"])
    assert version.exit_code == 0 and __version__ in version.output
    for args in (["-h"], ["score", "-h"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0 and "Usage:" in result.output and "--help" in result.output


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory, smollm_artefact):
    pytest.importorskip("llama_cpp")
    smollm_artefact("llamacpp", "f32")  # the default type
    tmp = tmp_path_factory.mktemp("outputs")
    requests = tmp / "requests.jsonl"
    requests.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    out = tmp / "scores.csv"
    result = CliRunner().invoke(main, ["score", str(requests), "--out", str(out), "--format", "csv", "--top-k", "3",
                                       "--threads", "2"])
    assert result.exit_code == 0, result.output
    return out


def test_every_candidate_describes_its_tokens(csv_run):
    lines = [json.loads(t) for t in csv_run.with_name(csv_run.name + ".jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == ["q", 7]
    assert [line["scored_end_of_turn"] for line in lines] == [True, False]  # raw text: no turn to end
    for line in lines:
        for k, c in enumerate(line["candidates"]):
            n = c["n_tokens"]
            assert c["index"] == k
            assert len(c["token_ids"]) == len(c["token_texts"]) == len(c["token_ranks"]) == len(c["top_k"]) == n
            for lp, rank, is_argmax, top in zip(c["token_logprobs"], c["token_ranks"], c["token_is_argmax"],
                                                c["top_k"], strict=True):
                assert len(top) == 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top),
                                                                                 reverse=True)
                assert (rank == 1) == is_argmax
                assert top[0]["logprob"] >= lp - 1e-9
                if rank <= 3:
                    assert top[rank - 1]["logprob"] == pytest.approx(lp, abs=1e-9)
    assert "".join(lines[1]["candidates"][0]["token_texts"]) == " three"


def test_meta_sidecar_names_what_produced_the_scores(csv_run):
    meta = json.loads(meta_path(csv_run).read_text())
    assert meta["fastscore_version"] == __version__ and meta["model"] == "smollm2-135m-instruct"
    # The default type is the exact one, derived from the shipped Q4_1 file (the note says so).
    assert (meta["backend"], meta["quant"]) == ("llamacpp", "f32") and "Q4_1" in meta["weights_note"]
    assert meta["exactness"]["backend_options"]["kv_type"] == "f32" and not meta["exactness"]["batch_dependent"]
    assert len(meta["tokenizer"]["sha256"]) == 64 and meta["top_k"] == 3
    assert meta["command"].startswith("fastscore score") and "--format csv" in meta["command"]
    assert meta["libraries"]["llama-cpp-python"]


def test_csv_and_parquet_hold_one_row_per_candidate(csv_run, tmp_path):
    with open(csv_run, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["id"], r["index"], r["text"]) for r in rows] == [("q", "0", "Paris"), ("q", "1", "Lyon"),
                                                                 ("7", "0", " three"), ("7", "1", " four")]
    lines = [json.loads(t) for t in csv_run.with_name(csv_run.name + ".jsonl").read_text().splitlines()]
    assert json.loads(rows[0]["token_logprobs"]) == lines[0]["candidates"][0]["token_logprobs"]
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "scores.parquet"
    write_table([row for line in lines for row in flatten(line)], out, "parquet")
    table = pq.read_table(out).to_pylist()
    assert [r["text"] for r in table] == ["Paris", "Lyon", " three", " four"]
    assert table[2]["token_ids"] == lines[1]["candidates"][0]["token_ids"]
    assert table[0]["top_k"][0][0]["logprob"] == lines[0]["candidates"][0]["top_k"][0][0]["logprob"]


def test_stdout_cannot_take_a_table_format(tmp_path):
    requests = tmp_path / "r.jsonl"
    requests.write_text(json.dumps(REQUESTS[0]) + "\n")
    result = CliRunner().invoke(main, ["score", str(requests), "--out", "-", "--format", "csv"])
    assert result.exit_code == 10 and "needs an output file" in result.output
