"""The lm-evaluation-harness model "fastscore" (fastscore.integrations.lm_eval).

Fast tests run the adapter on the instrumented fake backend (the real Scorer, trie and decoder over the embedded
model's vocabulary): HFLM's context/continuation split, one backend call for a whole request list, rolling
log-likelihoods, stop strings. The slow tests run a local task (tests/lm_eval_task: task YAML + jsonl, offline)
through lm_eval with fastscore and with lm-eval's own `hf` model on the reference weights.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from fastscore.integrations.lm_eval import FastscoreLM  # noqa: E402
from fastscore.records import TokenRequest  # noqa: E402

TASK_DIR = Path(__file__).parent / "lm_eval_task"
TASKS = ("fastscore_mc", "fastscore_rolling", "fastscore_generate")


def _instances(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0, metadata=("t", k, 1)) for k, a in enumerate(args)]


def _ids(tokenizer, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text).ids]


def test_the_model_is_registered_under_its_name():
    assert get_model("fastscore") is FastscoreLM


def test_loglikelihood_scores_every_request_in_one_backend_call_with_hflm_splits(fake_scorer):
    lm = FastscoreLM(scorer=fake_scorer)
    backend, tok = fake_scorer.backend, fake_scorer.tokenizer
    requests = [("Question: What color is the sky?\nAnswer:", " blue"),
                ("Question: What color is the sky?\nAnswer:", " green"),
                ("Question: What color is the sky?\nAnswer: ", "red"),  # the trailing space joins the continuation
                ("", "Hello world")]  # no context: conditioned on the prefix token (EOS for this tokenizer)
    got = lm.loglikelihood(_instances("loglikelihood", requests))
    assert backend.calls == [len(requests)], "the whole list goes to the backend in one call (one trie)"
    eos = tok.eos_id
    expected_pairs = [
        (_ids(tok, requests[0][0]), _ids(tok, requests[0][0] + " blue")[len(_ids(tok, requests[0][0])):]),
        (_ids(tok, requests[1][0]), _ids(tok, requests[1][0] + " green")[len(_ids(tok, requests[1][0])):]),
        (_ids(tok, requests[2][0].rstrip()), _ids(tok, requests[2][0] + "red")[len(_ids(tok, requests[2][0].rstrip())):]),
        ([eos], _ids(tok, "Hello world")),
    ]
    deltas = []
    for (logprob, greedy), (context, continuation) in zip(got, expected_pairs, strict=True):
        alone = backend.score_alone(TokenRequest(tuple(context + continuation), len(context)))
        deltas.append(abs(logprob - alone.total))
        assert greedy == bool(np.all(alone.is_argmax))
    print(f"max |delta| vs scoring each request alone: {max(deltas):.3g}")
    assert max(deltas) < 1e-9
    assert got[2][0] != got[0][0]  # " red" after "Answer:" is a different request from " blue"


def test_sequences_longer_than_max_length_lose_tokens_on_the_left_as_in_hflm(fake_scorer):
    lm = FastscoreLM(scorer=fake_scorer, max_length=12)
    tok = fake_scorer.tokenizer
    context = "one two three four five six seven eight nine ten eleven twelve thirteen"
    (logprob, _), = lm.loglikelihood(_instances("loglikelihood", [(context, " fourteen")]))
    whole = _ids(tok, context + " fourteen")
    n_cont = len(whole) - len(_ids(tok, context))
    kept = whole[-13:]  # HFLM: the last max_length + 1 tokens
    alone = fake_scorer.backend.score_alone(TokenRequest(tuple(kept), len(kept) - n_cont))
    assert logprob == pytest.approx(alone.total, abs=1e-9)


def test_rolling_loglikelihood_covers_every_token_once(fake_scorer):
    tok = fake_scorer.tokenizer
    text = "The quick brown fox jumps over the lazy dog, and then it runs back into the green forest again."
    ids = _ids(tok, text)
    wide = FastscoreLM(scorer=fake_scorer)
    (total,) = wide.loglikelihood_rolling(_instances("loglikelihood_rolling", [(text,)]))
    alone = fake_scorer.backend.score_alone(TokenRequest(tuple([tok.eos_id, *ids]), 1))
    print(f"rolling vs one pass: |delta| {abs(total - alone.total):.3g}")
    assert total == pytest.approx(alone.total, abs=1e-9)
    # Narrow windows: every token is still predicted exactly once, in one backend call for all windows.
    narrow = FastscoreLM(scorer=fake_scorer, max_length=6)
    before, calls = fake_scorer.backend.stats.scored_tokens, len(fake_scorer.backend.calls)
    (windowed,) = narrow.loglikelihood_rolling(_instances("loglikelihood_rolling", [(text,)]))
    assert fake_scorer.backend.stats.scored_tokens - before == len(ids)
    assert len(fake_scorer.backend.calls) == calls + 1
    assert windowed != pytest.approx(total)  # shorter contexts give other numbers


def test_generate_until_is_the_greedy_completion_cut_at_the_first_stop_string(fake_scorer):
    from fastscore.records import GreedyRequest

    lm = FastscoreLM(scorer=fake_scorer)
    tok = fake_scorer.tokenizer
    prompt = "Question: what is the capital of Italy?\nAnswer:"
    (reference,) = fake_scorer.greedy([GreedyRequest("g", (), prompt=prompt)], max_new_tokens=12)
    full = tok.decode(reference.token_ids, skip_special_tokens=True)
    (free,) = lm.generate_until(_instances("generate_until", [(prompt, {"until": [], "max_gen_toks": 12})]))
    assert free == full and len(reference.token_ids) > 3
    # A stop string from the middle of the completion: the first piece (after two) not seen earlier in the text.
    stop = next(piece for k in range(2, len(reference.token_ids))
                if (piece := tok.decode([reference.token_ids[k]])).strip()
                and full.find(piece) == len(tok.decode(reference.token_ids[:k], skip_special_tokens=True)))
    got = lm.generate_until(_instances("generate_until", [(prompt, {"until": [stop], "max_gen_toks": 12}),
                                                          (prompt, {"until": [], "max_gen_toks": 3})]))
    assert got[0] == full[: full.index(stop)]
    assert got[1] == tok.decode(reference.token_ids[:3], skip_special_tokens=True)


def test_chat_templated_prompts_use_the_models_template(fake_scorer):
    lm = FastscoreLM(scorer=fake_scorer)
    text = lm.apply_chat_template([{"role": "user", "content": "2+2?"}])
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n2+2?<|im_end|>" in text
    assert lm.chat_template(True) == fake_scorer.tokenizer.chat_template and lm.chat_template(False) is None
    # The template's special tokens are read as special tokens, as transformers reads them.
    assert fake_scorer.tokenizer.token_text(lm.tok_encode(text)[0]) == "<|im_start|>"


def test_sampling_is_refused(fake_scorer):
    from fastscore.errors import UnsupportedError

    lm = FastscoreLM(scorer=fake_scorer)
    with pytest.raises(UnsupportedError, match="greedily"):
        lm.generate_until(_instances("generate_until", [("Hi", {"until": [], "do_sample": True,
                                                                  "temperature": 0.7})]))


# --- the real model, through lm_eval, against lm-eval's own HF model ---


@pytest.fixture
def task_dir(tmp_path, monkeypatch) -> Path:
    """The local tasks in a scratch folder, as the working directory (their data_files are relative), offline."""
    folder = tmp_path / "tasks"
    shutil.copytree(TASK_DIR, folder)
    monkeypatch.chdir(folder)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    return folder


def _responses(result: dict, task: str) -> list:
    return [sample["resps"] for sample in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


@pytest.mark.slow
def test_local_tasks_match_lm_evals_hf_model_on_the_reference_weights(task_dir, smollm_artefact):
    import lm_eval
    from lm_eval.tasks import TaskManager

    import torch

    reference = smollm_artefact("reference", "fp32").path  # the dequantised fp32 HF folder of the embedded model
    smollm_artefact("llamacpp", "f32")
    manager = TaskManager(include_path=str(task_dir))
    # One thread each: the speed ratio compares the engines, not how each copes with a shared, oversubscribed CPU.
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        models = {
            "fastscore": get_model("fastscore").create_from_arg_string("backend=llamacpp,quant=f32,threads=1"),
            "hf": get_model("hf").create_from_arg_string(f"pretrained={reference},dtype=float32,device=cpu",
                                                         {"batch_size": 8}),
        }
        results, seconds = {}, {name: [] for name in models}
        for _ in range(2):  # alternated, so both see the same machine load; the second round is timed warm
            for name, lm in models.items():
                start = time.perf_counter()
                results[name] = lm_eval.simple_evaluate(model=lm, tasks=list(TASKS), task_manager=manager,
                                                        log_samples=True, bootstrap_iters=0, verbosity="ERROR")
                seconds[name].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(torch_threads)
    fast, hf = results["fastscore"], results["hf"]
    mc_fast, mc_hf = _responses(fast, "fastscore_mc"), _responses(hf, "fastscore_mc")
    assert len(mc_fast) == 20
    deltas = [abs(a[0][0] - b[0][0]) for doc_a, doc_b in zip(mc_fast, mc_hf, strict=True)
              for a, b in zip(doc_a, doc_b, strict=True)]
    rolling = [abs(a[0][0] - b[0][0]) for a, b in zip(_responses(fast, "fastscore_rolling"),
                                                 _responses(hf, "fastscore_rolling"), strict=True)]
    acc = {name: r["results"]["fastscore_mc"]["acc,none"] for name, r in results.items()}
    acc_norm = {name: r["results"]["fastscore_mc"]["acc_norm,none"] for name, r in results.items()}
    load = os.getloadavg()[0]
    print(f"fastscore_mc acc {acc}, acc_norm {acc_norm}; max |delta loglik| {max(deltas):.2e} over {len(deltas)} "
          f"requests; rolling max |delta| {max(rolling):.2e}; generations equal: "
          f"{_responses(fast, 'fastscore_generate') == _responses(hf, 'fastscore_generate')}")
    print(f"seconds per simple_evaluate (cold, warm): fastscore {seconds['fastscore']}, hf {seconds['hf']}; "
          f"warm speed ratio hf/fastscore {seconds['hf'][1] / seconds['fastscore'][1]:.2f} (load average {load:.1f})")
    assert acc["fastscore"] == acc["hf"] and acc_norm["fastscore"] == acc_norm["hf"]
    assert max(deltas) < 1e-3
    assert max(rolling) < 1e-3
    assert [[c[0][1] for c in doc] for doc in mc_fast] == [[c[0][1] for c in doc] for doc in mc_hf]  # is_greedy
    assert _responses(fast, "fastscore_generate") == _responses(hf, "fastscore_generate")


@pytest.mark.slow
def test_the_fastscore_lm_eval_command_runs_a_task(task_dir, smollm_artefact, tmp_path):
    smollm_artefact("llamacpp", "f32")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "fastscore.integrations.lm_eval", "--model", "fastscore",
                          "--model_args", "backend=llamacpp,quant=f32,threads=1", "--tasks", "fastscore_mc", "--limit", "4",
                          "--include_path", str(task_dir), "--output_path", str(out)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=task_dir)
    assert run.returncode == 0, run.stderr[-3000:]
    (written,) = out.rglob("results_*.json")
    results = json.loads(written.read_text())
    assert results["results"]["fastscore_mc"]["sample_len"] == 4 and "acc,none" in results["results"]["fastscore_mc"]
    assert results["config"]["model"] == "fastscore"
