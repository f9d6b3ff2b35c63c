"""Cross-backend parity through the Scorer: every fast backend against the transformers fp32 reference.

Requests are real study items: three BFCL tool-call items (fastscore.study.data.envs.tools.env, seed 0), each scored
under `before` (system + user) and `after` (+ the failed call + the runtime's error), four candidate calls each: 24
sequences. The corrective gain of a candidate is G = lp(before) - lp(after).

Tolerances (run with -s to see the measured differences):
- exact-arithmetic variants, per scored token: f32 GGUF on llama.cpp (f32 KV cache, flash attention off) <= 2e-3
  nats, ONNX fp32 <= 1e-3 nats; on summed gains <= 1e-2 nats. Both read the same dequantized weights as the
  reference, so only float32 summation order differs.
- quantised variants (shipped Q4_1 GGUF, ONNX int8): every gain with |G_ref| > 1 nat keeps its sign; the argmax of
  each candidate set agrees on at least 2/3 of the sets, and on every set whose reference margin exceeds 1 nat.
- sharing on llama.cpp f32: one call for all requests equals each request alone, any batch split and any order,
  to float32 rounding (<= fastscore.variants.BATCH_INVARIANCE_TOL nats per token).
- `fastscore score` on examples/tool_calls.jsonl: the same per-token tolerances between the three backends. The
  CLI's llama.cpp defaults are the exact-arithmetic settings (f32 KV cache, flash attention off for scoring), so
  the f32 GGUF is held to the 2e-3 check there too.

The ONNX int8 check and `fastscore score` on ONNX are marked slow (`make test-all`; docs/testing.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fastscore.backends.options import options_for
from fastscore.cli import main
from fastscore.records import CandidateSet, ScoreRequest
from fastscore.registry import default_model
from fastscore.requests_io import read_requests
from fastscore.scorer import Scorer
from fastscore.selection import ModelSelection
from fastscore.study.data.conditions import render_conditions
from fastscore.study.data.envs.tools.env import ToolsEnv
from fastscore.variants import BATCH_INVARIANCE_TOL

pytest.importorskip("llama_cpp")
pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tool_calls.jsonl"

F32_GGUF_TOL = 2e-3  # nats per scored token
ONNX_FP32_TOL = 1e-3
GAIN_TOL = 1e-2  # nats per summed gain, exact-arithmetic variants
SHARING_TOL = BATCH_INVARIANCE_TOL
LARGE_GAIN = 1.0
DECISIVE_MARGIN = 1.0
MIN_ARGMAX_AGREEMENT = 2 / 3

# The module scores 24 long sequences on four backends (most of the default suite's real-model arithmetic), so it
# uses every core CI has (2). On a machine busy with other work, extra llama.cpp threads wait at barriers and slow every
# backend several-fold: run it there with FASTSCORE_TEST_THREADS=1. The checks do not depend on the thread count.
THREADS = int(os.environ.get("FASTSCORE_TEST_THREADS", "2"))
EXACT_LLAMACPP = {"kv_type": "f32", "flash_attn": "off", "decode_flash_attn": "off", "n_threads": THREADS}
VARIANTS = {  # label -> (backend, quant, backend options)
    "reference": ("reference", "fp32", {"n_threads": THREADS}),
    "llamacpp-f32": ("llamacpp", "f32", EXACT_LLAMACPP),
    "onnx-fp32": ("onnx", "fp32", {"n_threads": THREADS}),
    "llamacpp-q4_1": ("llamacpp", "q4_1", {"n_threads": THREADS}),
    "onnx-int8": ("onnx", "int8", {"n_threads": THREADS}),
}
EXACT_TOL = {"llamacpp-f32": F32_GGUF_TOL, "onnx-fp32": ONNX_FP32_TOL}
CONDITIONS = ("before", "after")


def open_variant(backend: str, quant: str, options: dict, model: str | None = None) -> Scorer:
    """The selection's Scorer of `model` (default: the embedded model) with typed backend options (n_threads apart: it
    is the selection's own argument)."""
    fields = {k: v for k, v in options.items() if k != "n_threads"}
    return ModelSelection.resolve(model or default_model(), backend, quant, threads=options.get("n_threads"),
                                  backend_options=options_for(backend, fields)).open()


@pytest.fixture(scope="module")
def tool_sets(study_data) -> list[CandidateSet]:
    """before, after, before, after, ... for three tool-call items: 6 sets of 4 candidates."""
    env = ToolsEnv(study_data)
    items, _ = env.build_items(limit=3, seed=0)
    assert len(items) == 3
    return [context.candidate_set(item.candidates)
            for item in items for context in render_conditions(item, env, CONDITIONS)]


def _scorer_cache(artefact_of, model: str | None = None):
    """A getter opening each variant of `model` (default: the embedded model) once for the module, and a closer."""
    opened: dict[str, Scorer] = {}

    def get(label: str) -> Scorer:
        if label not in opened:
            backend, quant, options = VARIANTS[label]
            artefact_of(backend, quant)  # any conversion happens in the session fixture
            opened[label] = open_variant(backend, quant, options, model)
        return opened[label]

    def close() -> None:
        for scorer in opened.values():
            scorer.close()

    return get, close


@pytest.fixture(scope="module")
def smollm_scorer(smollm_artefact):
    get, close = _scorer_cache(smollm_artefact)
    yield get
    close()


@pytest.fixture(scope="module")
def smollm_results(smollm_scorer, tool_sets):
    """label -> the variant's CandidateSetResults on tool_sets, computed once."""
    done: dict = {}

    def get(label: str):
        if label not in done:
            done[label] = smollm_scorer(label).score_candidates(tool_sets)
        return done[label]

    return get


# --- comparisons ---


def token_logprobs(results) -> np.ndarray:
    return np.concatenate([r.token_logprobs for s in results for r in s.results])


def totals(results) -> np.ndarray:
    """[n_sets, n_candidates] summed log-probs."""
    return np.array([[r.logprob for r in s.results] for s in results])


def gains(results) -> np.ndarray:
    """[n_items, n_candidates] G = lp(before) - lp(after); sets alternate before, after."""
    t = totals(results)
    return t[0::2] - t[1::2]


def same_tokens(a, b) -> None:
    assert [r.token_ids for s in a for r in s.results] == [r.token_ids for s in b for r in s.results]


def exact_parity(label: str, got, want, tol: float) -> None:
    same_tokens(got, want)
    token_diff = np.abs(token_logprobs(got) - token_logprobs(want)).max()
    gain_diff = np.abs(gains(got) - gains(want)).max()
    message = (f"{label} vs reference: max |diff| {token_diff:.2e} nats/token (tolerance {tol:g}) over "
               f"{len(token_logprobs(got))} tokens, max |gain diff| {gain_diff:.2e} nats (tolerance {GAIN_TOL:g})")
    print(message)
    assert token_diff <= tol, message
    assert gain_diff <= GAIN_TOL, message


@pytest.mark.parametrize("label", sorted(EXACT_TOL))
def test_smollm_exact_variants_match_reference(smollm_results, label):
    exact_parity(f"SmolLM2-135M {label}", smollm_results(label), smollm_results("reference"), EXACT_TOL[label])


@pytest.mark.parametrize("label", [
    "llamacpp-q4_1",
    # Slow (the 135M's int8 graph scoring all 24 sequences, ~25 s on a loaded 2-core machine): the default suite keeps
    # this check on the shipped q4_1 just above, and int8 against the reference on the tiny model in
    # test_onnx_backend.py::test_int8_tracks_reference.
    pytest.param("onnx-int8", marks=pytest.mark.slow),
])
def test_smollm_quantised_variants_keep_signs_and_ranks(smollm_results, label):
    got, want = smollm_results(label), smollm_results("reference")
    g, g_ref = gains(got), gains(want)
    large = np.abs(g_ref) > LARGE_GAIN
    sign_agree = np.sign(g[large]) == np.sign(g_ref[large])
    t, t_ref = totals(got), totals(want)
    argmax_agree = t.argmax(axis=1) == t_ref.argmax(axis=1)
    ordered = np.sort(t_ref, axis=1)
    decisive = ordered[:, -1] - ordered[:, -2] > DECISIVE_MARGIN
    message = (f"SmolLM2-135M {label} vs reference: large-gain signs agree {sign_agree.sum()}/{large.sum()}, "
               f"max |gain diff| {np.abs(g - g_ref).max():.3f} nats, max |diff| "
               f"{np.abs(token_logprobs(got) - token_logprobs(want)).max():.3f} nats/token; candidate-set argmax "
               f"agrees {argmax_agree.sum()}/{len(argmax_agree)} ({argmax_agree.mean():.2f}), on decisive sets "
               f"(margin > {DECISIVE_MARGIN:g} nat) {argmax_agree[decisive].sum()}/{decisive.sum()}")
    print(message)
    assert large.sum() > 0, message
    assert sign_agree.all(), message
    assert argmax_agree.mean() >= MIN_ARGMAX_AGREEMENT, message
    assert argmax_agree[decisive].all(), message


# --- tiny random Llama, Qwen2 and Qwen3: the converters and backends on each architecture ---


@pytest.fixture(scope="module")
def tiny_scorer(tiny_model, tiny_artefact):
    cache: dict = {}

    def get(arch: str, label: str) -> Scorer:
        if arch not in cache:
            # The tiny model's own folder: opening the default model here would test the 135M again under this name.
            cache[arch] = _scorer_cache(lambda backend, quant: tiny_artefact(arch, backend, quant),
                                        str(tiny_model(arch)))
        scorer = cache[arch][0](label)
        assert f"tiny-{arch}" in str(scorer.backend.path), scorer.backend.path
        return scorer

    yield get
    for _, close in cache.values():
        close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_models_exact_variants_match_reference(tiny_scorer, tool_sets, arch):
    want = tiny_scorer(arch, "reference").score_candidates(tool_sets)
    for label, tol in sorted(EXACT_TOL.items()):
        exact_parity(f"tiny {arch} {label}", tiny_scorer(arch, label).score_candidates(tool_sets), want, tol)


# --- sharing on llama.cpp f32 ---


@pytest.fixture(scope="module")
def sharing_sets(tool_sets) -> list[CandidateSet]:
    """The shortest item's before and after sets (8 requests): scoring each alone stays cheap."""
    pairs = [tool_sets[i : i + 2] for i in range(0, len(tool_sets), 2)]
    return min(pairs, key=lambda pair: sum(len(m.content) for m in pair[1].messages))


def _requests(sets):
    return [ScoreRequest(s.id, s.messages, c) for s in sets for c in s.candidates]


def test_llamacpp_f32_sharing_is_exact(smollm_scorer, smollm_artefact, sharing_sets):
    scorer = smollm_scorer("llamacpp-f32")
    together = scorer.score_candidates(sharing_sets)
    singles = [CandidateSet(f"{s.id}/{k}", s.messages, (c,))
               for s in sharing_sets for k, c in enumerate(s.candidates)]
    alone = np.concatenate([token_logprobs(scorer.score_candidates([single])) for single in singles])
    reversed_order = token_logprobs(scorer.score_candidates(singles[::-1])[::-1])
    # Batches of at most two requests: the scorer splits one call into several backend calls.
    longest = max(len(scorer.prepare(r).token_request.tokens) for r in _requests(singles))
    small_batches = Scorer(scorer.backend, scorer.tokenizer, max_batch_tokens=2 * longest)
    packs_before = scorer.backend.stats.extra.get("packs", 0)
    split = token_logprobs(small_batches.score_candidates(sharing_sets))
    assert scorer.backend.stats.extra["packs"] - packs_before >= len(singles) // 2
    # At most 3 sequences per llama.cpp batch: the trie is packed differently.
    narrow = open_variant("llamacpp", "f32", {**EXACT_LLAMACPP, "n_seq_max": 3})
    with narrow:
        packed = token_logprobs(narrow.score_candidates(sharing_sets))
        assert narrow.backend.stats.extra["packs"] >= len(singles) // 3
    reference = token_logprobs(together)
    diffs = {name: float(np.abs(values - reference).max()) for name, values in
             [("each alone", alone), ("reversed order", reversed_order), ("small batches", split),
              ("n_seq_max=3", packed)]}
    message = (f"llama.cpp f32, {len(reference)} tokens of {len(singles)} requests, max |diff| vs one shared call: "
               + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()) + f" (tolerance {SHARING_TOL:g})")
    print(message)
    assert max(diffs.values()) <= SHARING_TOL, message


# --- `fastscore score` on the hand-written example ---


CLI_RUNS = {  # label -> (CLI arguments, per-token tolerance against the reference run)
    "reference": (["--backend", "reference"], 0.0),
    "llamacpp-f32": (["--backend", "llamacpp", "--quant", "f32"], F32_GGUF_TOL),
    "onnx-fp32": (["--backend", "onnx", "--quant", "fp32"], ONNX_FP32_TOL),
}


@pytest.fixture(scope="module")
def cli_outputs(smollm_artefact, tmp_path_factory):
    """cli_outputs(label) -> the output lines of `fastscore score examples/tool_calls.jsonl` on that backend, run once
    on first request (a deselected backend is never run)."""
    out_dir = tmp_path_factory.mktemp("cli-parity")
    outputs = {}

    def get(label: str) -> list[dict]:
        if label not in outputs:
            args, _ = CLI_RUNS[label]
            backend, quant, _ = VARIANTS[label]
            smollm_artefact(backend, quant)  # any conversion happens in the session fixture, not under the CLI
            out = out_dir / f"{label}.jsonl"
            result = CliRunner().invoke(main, ["score", str(EXAMPLES), "--out", str(out), "--threads", str(THREADS),
                                               *args])
            assert result.exit_code == 0, f"{label}: {result.output}"
            outputs[label] = [json.loads(line) for line in out.read_text().splitlines()]
        return outputs[label]

    return get


def cli_diffs(got: list[dict], want: list[dict]) -> tuple[float, float]:
    """(max |diff| per token, max |diff| per candidate logprob) between two output files."""
    token, total = 0.0, 0.0
    assert [line["id"] for line in got] == [line["id"] for line in want]
    for a, b in zip(got, want, strict=True):
        for ca, cb in zip(a["candidates"], b["candidates"], strict=True):
            assert ca["text"] == cb["text"] and ca["n_tokens"] == cb["n_tokens"]
            token = max(token, float(np.abs(np.subtract(ca["token_logprobs"], cb["token_logprobs"])).max()))
            total = max(total, abs(ca["logprob"] - cb["logprob"]))
    return token, total


def test_example_file_is_valid_and_realistic():
    records = list(read_requests(EXAMPLES))  # the CLI's own validation
    assert len(records) >= 5
    assert all(r.messages[0].role == "system" and len(r.candidates) >= 2 for r in records)
    assert any(m.role == "tool" for r in records for m in r.messages), "no failed call with a tool error"
    assert any(r.banned for r in records)


@pytest.mark.parametrize("label", [
    "llamacpp-f32",
    # Slow (one more `fastscore score` run loading the 135M's ONNX graph): the default suite holds ONNX fp32's parity
    # on the 135M in test_smollm_exact_variants_match_reference[onnx-fp32], and `score`'s path to the reference in
    # the llamacpp-f32 case just above.
    pytest.param("onnx-fp32", marks=pytest.mark.slow),
])
def test_cli_score_agrees_across_backends(cli_outputs, label):
    tol = CLI_RUNS[label][1]
    token, total = cli_diffs(cli_outputs(label), cli_outputs("reference"))
    message = (f"fastscore score {EXAMPLES.name}: {label} vs reference: max |diff| {token:.2e} nats/token "
               f"(tolerance {tol:g}), {total:.2e} nats per candidate logprob")
    print(message)
    assert token <= tol, message
