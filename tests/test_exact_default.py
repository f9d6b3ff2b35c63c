"""The default weights are batch-invariant: a token's log-prob does not depend on what shares its call.

`score`, `study` and the quant check's llama.cpp default is f32 (derived from the shipped Q4_1 file). Here one item's
requests are scored alone, with other items, in groups of any size and in micro-batches (llama.cpp's n_ubatch) of
any size, on the real embedded model with the default scoring settings; every per-token log-prob must agree to
1e-5 nats. The shipped Q4_1 file, whose 8-bit activation rounding depends on the batch, moves by ~0.1-1 nats here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fastscore.records import ScoreRequest
from fastscore.registry import default_model
from fastscore.requests_io import read_requests
from fastscore.session import default_quant

pytest.importorskip("llama_cpp")
from fastscore.backends.llamacpp import LlamaCppBackend  # noqa: E402
from fastscore.backends.options import LlamaCppOptions  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tool_calls.jsonl"
TOLERANCE = 1e-5  # nats per token


@pytest.fixture(scope="module")
def item_requests(smollm_artefact):
    """Token requests of every candidate of the example items (item id -> its requests), on the default type."""
    from fastscore.scorer import Scorer
    from fastscore.tokenizer import Tokenizer

    quant = default_quant(default_model())
    artefact = smollm_artefact("llamacpp", quant)
    backend = LlamaCppBackend(artefact.path, n_threads=2)
    scorer = Scorer(backend, Tokenizer.from_folder(artefact.tokenizer_dir),
                    chat_template_kwargs=artefact.chat_template_kwargs)
    by_item = {r.id: [scorer.prepare(ScoreRequest(r.id, r.messages, c)).token_request for c in r.candidates]
               for r in read_requests(EXAMPLES)}
    yield artefact.path, by_item
    backend.close()


def _logprobs(path: Path, requests, **options) -> list[np.ndarray]:
    with LlamaCppBackend(path, n_threads=2, options=dataclasses.replace(LlamaCppOptions(), **options)) as backend:
        return [s.logprobs for s in backend.score_tokens(requests)]


def test_the_default_type_scores_an_item_the_same_in_any_batch(item_requests):
    path, by_item = item_requests
    items = list(by_item.values())
    item, others = items[0], items[1]
    with LlamaCppBackend(path, n_threads=2) as backend:
        want = [backend.score_tokens([r])[0].logprobs for r in item]  # each request alone
        layouts = {
            "the item in one call": [s.logprobs for s in backend.score_tokens(item)],
            "with another item, reversed": [s.logprobs for s in backend.score_tokens(others + item[::-1])
                                            ][len(others):][::-1],
        }
    layouts["with another item, groups of one request"] = _logprobs(path, item + others, max_group_tokens=1)[:len(item)]
    layouts["with another item, one group"] = _logprobs(path, others + item, max_group_tokens=4096)[len(others):]
    layouts["micro-batches of 32 tokens"] = _logprobs(path, others + item, n_ubatch=32)[len(others):]
    for name, got in layouts.items():
        worst = max(float(np.abs(a - b).max()) for a, b in zip(got, want))
        print(f"\n{name}: max |d logprob| vs alone = {worst:.2e} nats/token")
        assert worst <= TOLERANCE, name
