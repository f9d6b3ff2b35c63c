"""The benchmark's stronger transformers peer: each context's KV cache computed once, reused by all its candidates.

What a careful user of transformers would write for "score K candidates under one chat context": one forward pass
over the prefix the candidates share, with `use_cache`, then one pass per candidate on that past, cropped back to
the prefix afterwards. It is a peer for timing only (fp32 weights, same tokens as fastscore and the one-request-
per-call reference); the product's reference backend stays deliberately plain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastscore.engine.plan import Gather
from fastscore.engine.trie import common_prefix
from fastscore.records import CandidateSet, TokenRequest


def shared_prefix_length(requests: Sequence[TokenRequest]) -> int:
    """Tokens every request shares that predict no scored token (so every scored row comes from a candidate pass)."""
    shared = min(len(r.tokens) for r in requests)
    for r in requests[1:]:
        shared = min(shared, common_prefix(requests[0].tokens, r.tokens))
    return max(0, min(shared, *(r.score_from - 1 for r in requests)))


def score_set_with_prefix_kv(model, torch, requests: Sequence[TokenRequest]) -> list[float]:
    """Summed log-probs of each request: the shared prefix runs once, each request's rest on a copy of its past."""
    prefix = shared_prefix_length(requests)
    cache = None
    with torch.inference_mode():
        if prefix:
            cache = model(input_ids=torch.tensor([requests[0].tokens[:prefix]]), use_cache=True).past_key_values
        totals = []
        for index, request in enumerate(requests):
            rest = torch.tensor([request.tokens[prefix:]])
            logits = model(input_ids=rest, past_key_values=cache, use_cache=True,
                           logits_to_keep=request.n_scored + 1).logits[0, :-1].numpy()
            if cache is not None:
                cache.crop(prefix)  # back to the shared prefix for the next candidate
            scores = Gather.whole(index, request).scores(logits)[0]
            totals.append(float(np.sum(scores.logprobs, dtype=np.float64)))
    return totals


def score_with_prefix_kv(scorer, sets: Sequence[CandidateSet]) -> list[float]:
    """Text in, summed log-probs out, every candidate of every set (the order of Scorer.score_candidates)."""
    backend = scorer.backend
    out: list[float] = []
    for candidate_set in sets:
        requests = [scorer.prepare(request).token_request for request in candidate_set.score_requests()]
        out += score_set_with_prefix_kv(backend.model, backend.torch, requests)
    return out
