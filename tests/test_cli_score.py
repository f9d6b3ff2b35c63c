"""`fastscore score` end to end on the shipped Q4_1 GGUF (llama.cpp): output fields, exit codes, no tracebacks."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from fastscore.cli import main
from fastscore.outputs import partial_path

pytest.importorskip("llama_cpp")

REQUESTS = [
    {"id": "capital", "messages": [{"role": "user", "content": "What is the capital of France?"}],
     "candidates": ["Paris", "The capital of France is Paris."], "banned": ["Paris"]},
    {"id": 2, "messages": [{"role": "system", "content": "Answer in one word."},
                           {"role": "user", "content": "Colour of the sky?"}], "candidates": ["Blue"]},
]


def _write(tmp_path, lines):
    path = tmp_path / "requests.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def scored(tmp_path_factory, smollm_artefact):
    smollm_artefact("llamacpp", "q4_1")  # the tokenizer folder is built once for the session
    tmp_path = tmp_path_factory.mktemp("cli")
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        main, ["score", str(_write(tmp_path, REQUESTS)), "--out", str(out), "--generate", "--max-new-tokens", "4",
               "--threads", "2"],
    )
    return result, [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_score_writes_one_line_per_request_with_every_field(scored):
    result, lines = scored
    print(result.output)
    assert result.exit_code == 0, result.output
    assert "scored 2 requests (3 candidates)" in result.output and "Q4_1" in result.output
    assert [line["id"] for line in lines] == ["capital", 2]
    for line, request in zip(lines, REQUESTS):
        assert [c["text"] for c in line["candidates"]] == request["candidates"]
        assert math.isclose(sum(c["prob"] for c in line["candidates"]), 1.0, rel_tol=1e-9)
        for c in line["candidates"]:
            print(line["id"], c["text"], c["logprob"], c["n_tokens"], c["token_is_argmax"])
            assert all(isinstance(x, float) and math.isfinite(x) and x <= 0 for x in c["token_logprobs"])
            assert math.isclose(c["logprob"], sum(c["token_logprobs"]), rel_tol=1e-9)
            assert c["n_tokens"] == len(c["token_logprobs"]) == len(c["token_is_argmax"]) >= 2  # + end of turn
            assert c["logprob_per_token"] == pytest.approx(c["logprob"] / c["n_tokens"])
            assert c["boundary_straddles"] == 0
        greedy = line["greedy"]
        assert greedy["stopped_by"] in ("end_of_turn", "max_tokens") and isinstance(greedy["text"], str)
        assert greedy["banned_mass"] >= 0 and greedy["banned_steps"] >= 0
    assert lines[0]["greedy"]["text"].strip() != "Paris"


def test_exclude_end_of_turn_scores_one_token_fewer(tmp_path, scored):
    _, with_eot = scored
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["score", str(_write(tmp_path, REQUESTS[1:])), "--out", str(out),
                                       "--exclude-end-of-turn"])
    assert result.exit_code == 0, result.output
    [line] = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["scored_end_of_turn"] is False
    assert line["candidates"][0]["n_tokens"] == with_eot[1]["candidates"][0]["n_tokens"] - 1


def test_a_bad_line_exits_with_a_message_naming_it_and_keeps_earlier_lines(tmp_path, scored):
    out = tmp_path / "out.jsonl"
    path = _write(tmp_path, [REQUESTS[1], '{"id": "broken", "messages": ['])
    result = CliRunner().invoke(main, ["score", str(path), "--out", str(out)])
    print(result.output)
    assert result.exit_code == 6
    assert "line 2" in result.output and "malformed JSON" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()  # OUT is written only complete; the finished lines wait in OUT.partial for --resume
    assert [json.loads(text)["id"] for text in partial_path(out).read_text().splitlines()] == [2]


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--model", "smollm2-135m-instruckt"], 2, "Did you mean 'smollm2-135m-instruct'"),
        (["--backend", "llamacp"], 2, "unknown backend"),
        (["--quant", "q3"], 2, "unknown quant"),
    ],
)
def test_bad_options_exit_without_a_traceback(tmp_path, args, code, message):
    result = CliRunner().invoke(main, ["score", str(_write(tmp_path, REQUESTS)), "--out", str(tmp_path / "o.jsonl"),
                                       *args])
    print(result.output)
    assert result.exit_code == code and message in result.output
    assert "Traceback" not in result.output
