"""`logprob_rows` on every backend: normalised rows whose entries at the target tokens are score_tokens' log-probs.

Tiny random Llama, Qwen2 and Qwen3 checkpoints, real chat requests (shared contexts, several continuations).
Tolerances: each row's logsumexp is 0 to 1e-9 (the rows are float64 log-softmax); gathering the rows at the
scored tokens equals score_tokens to 1e-6 nats (both come from the same logits).
"""

from __future__ import annotations

import numpy as np
import pytest

from fastscore import backends
from fastscore.records import Message, ScoreRequest
from fastscore.scorer import Scorer
from fastscore.tokenizer import Tokenizer

NORMALISED_TOL = 1e-9
GATHER_TOL = 1e-6

SYSTEM = ("You are a function-calling assistant. Tools: get_weather(city: str, unit: str = 'celsius'). "
          "Respond with exactly one call.")
CONTEXTS = {
    "plain": (Message("system", SYSTEM), Message("user", "Weather in Lyon, in celsius?")),
    "after-error": (Message("system", SYSTEM), Message("user", "Weather in Lyon, in celsius?"),
                    Message("assistant", "get_weather(town='Lyon')"),
                    Message("tool", "TypeError: get_weather() got an unexpected keyword argument 'town'")),
}
CANDIDATES = ("get_weather(city='Lyon')", "get_weather(city='Lyon', unit='celsius')", "get_weather(town='Lyon')")

BACKENDS = {  # label -> (backend, quant, options)
    "reference": ("reference", "fp32", {"n_threads": 1}),
    "onnx-fp32": ("onnx", "fp32", {"n_threads": 1}),
    "llamacpp-f32": ("llamacpp", "f32", {"kv_type": "f32", "flash_attn": "off", "decode_flash_attn": "off",
                                         "n_threads": 1}),
}
REQUIRED_MODULE = {"reference": "transformers", "onnx-fp32": "onnxruntime", "llamacpp-f32": "llama_cpp"}


@pytest.fixture(scope="module")
def opened(tiny_artefact):
    """(arch, label) -> (backend, token requests), each backend loaded once for the module."""
    cache: dict = {}

    def get(arch: str, label: str):
        if (arch, label) not in cache:
            backend_name, quant, options = BACKENDS[label]
            pytest.importorskip(REQUIRED_MODULE[label])
            artefact = tiny_artefact(arch, backend_name, quant)
            engine = backends.load(backend_name, artefact.path, **options)
            scorer = Scorer(engine, Tokenizer.from_folder(artefact.tokenizer_dir),
                            chat_template_kwargs=artefact.chat_template_kwargs)
            requests = [scorer.prepare(ScoreRequest(f"{name}/{k}", messages, candidate)).token_request
                        for name, messages in CONTEXTS.items() for k, candidate in enumerate(CANDIDATES)]
            cache[arch, label] = (engine, requests)
        return cache[arch, label]

    yield get
    for engine, _ in cache.values():
        engine.close()


LABELS = [
    "reference",
    "onnx-fp32",
    "llamacpp-f32",
]


@pytest.mark.parametrize("label", LABELS)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_rows_are_normalised_and_gather_to_score_tokens(opened, arch, label):
    backend, requests = opened(arch, label)
    rows = backend.logprob_rows(requests)
    scores = backend.score_tokens(requests)
    assert len(rows) == len(scores) == len(requests)
    worst_norm = worst_gather = 0.0
    for request, row, score in zip(requests, rows, scores, strict=True):
        assert row.dtype == np.float64 and row.shape == (request.n_scored, backend.n_vocab)
        peak = row.max(axis=1)
        lse = peak + np.log(np.exp(row - peak[:, None]).sum(axis=1))
        targets = np.asarray(request.tokens[request.score_from :])
        gathered = row[np.arange(request.n_scored), targets]
        worst_norm = max(worst_norm, float(np.abs(lse).max()))
        worst_gather = max(worst_gather, float(np.abs(gathered - score.logprobs).max()))
        np.testing.assert_array_equal(row.argmax(axis=1) == targets, score.is_argmax)
    message = (f"tiny {arch} {label}: max |logsumexp| {worst_norm:.1e} (tolerance {NORMALISED_TOL:g}), "
               f"max |rows[target] - score_tokens| {worst_gather:.1e} nats (tolerance {GATHER_TOL:g}) over "
               f"{sum(r.n_scored for r in requests)} rows")
    print(message)
    assert worst_norm <= NORMALISED_TOL, message
    assert worst_gather <= GATHER_TOL, message
