"""OpenAI's legacy /v1/completions, for prompt log-probs: `echo: true, logprobs: N, max_tokens: 0`.

The answer is what OpenAI's API (and vLLM) return for that call: per choice, the prompt echoed as `text` and a
`logprobs` object with the prompt's `tokens` (their text pieces), `token_logprobs` (null for the first token, which
has nothing before it), `top_logprobs` (null first; then the N most likely tokens at each position and the prompt's
own token, as vLLM gives them) and `text_offset` (each token's first character in the prompt).

A prompt is a string, a list of strings (one choice each), a list of token ids, or a list of such lists. Text is
tokenized as the model's tokenizer reads a raw prompt (special-token text becomes the special token, as in vLLM and
transformers), with the BOS the tokenizer adds unless the text already starts with it. Nothing is generated: a
request asking for completion tokens is refused.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastscore.errors import RequestError, RequestTooLargeError
from fastscore.records import TokenRequest, TokenScores

MAX_LOGPROBS = 20  # top alternatives per position (vLLM's default limit; OpenAI's is 5)


@dataclass(frozen=True)
class Prompt:
    """One prompt as the model reads it: ids, each token's text piece and first character in `text`."""

    text: str
    ids: tuple[int, ...]
    pieces: tuple[str, ...]
    offsets: tuple[int, ...]


@dataclass(frozen=True)
class CompletionsCall:
    model: str
    prompts: tuple[Prompt, ...]
    logprobs: int | None  # None: no logprobs object in the answer

    def token_requests(self) -> list[TokenRequest]:
        """What the backend scores: every prompt of two tokens or more, from its second token on."""
        top_k = self.logprobs or 0
        return [TokenRequest(p.ids, 1, top_k=top_k) for p in self.prompts if len(p.ids) > 1]


def _as_int(value: Any, field: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise RequestError(f"'{field}' must be an integer {bound}, not {value!r}")
    return value


def _prompt_list(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return list(prompt)
    raise RequestError("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists")


def text_prompt(tokenizer, text: str) -> Prompt:
    if not text:
        raise RequestError("an empty prompt has no tokens to score")
    enc = tokenizer.encode(text)
    ids, offsets = [int(i) for i in enc.ids], [int(s) for s in enc.starts]
    bos = tokenizer.bos_id
    if tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
        ids, offsets = [bos, *ids], [0, *offsets]
    return Prompt(text, tuple(ids), tuple(tokenizer.decode_piece(i) for i in ids), tuple(offsets))


def ids_prompt(tokenizer, ids: Sequence[Any], n_vocab: int) -> Prompt:
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_vocab for i in ids):
        raise RequestError(f"a token-id prompt must be a non-empty list of ids in [0, {n_vocab})")
    pieces = tuple(tokenizer.decode_piece(i) for i in ids)
    offsets, cursor = [], 0
    for piece in pieces:
        offsets.append(cursor)
        cursor += len(piece)
    return Prompt("".join(pieces), tuple(int(i) for i in ids), pieces, tuple(offsets))


def parse_completions(body: Mapping[str, Any], tokenizer, n_vocab: int, max_prompts: int) -> CompletionsCall:
    """Validate a /v1/completions body (RequestError says what is wrong) and tokenize its prompts."""
    if not isinstance(body, Mapping):
        raise RequestError("the body must be a JSON object")
    if "prompt" not in body:
        raise RequestError("missing field 'prompt'")
    if body.get("echo") is not True:
        raise RequestError("this server returns prompt log-probs only: set \"echo\": true and \"max_tokens\": 0")
    if body.get("max_tokens") not in (None, 0):
        raise RequestError("this server does not generate: \"max_tokens\" must be 0 (with \"echo\": true the prompt's "
                           "log-probs are returned)")
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        raise RequestError("'n' and 'best_of' must be 1: nothing is sampled")
    if body.get("stream"):
        raise RequestError("'stream' is not supported")
    logprobs = body.get("logprobs")
    logprobs = None if logprobs is None else _as_int(logprobs, "logprobs", 0, MAX_LOGPROBS)
    raw = _prompt_list(body["prompt"])
    if len(raw) > max_prompts:
        raise RequestTooLargeError(f"{len(raw)} prompts in one request; at most {max_prompts}")
    prompts = tuple(text_prompt(tokenizer, p) if isinstance(p, str) else ids_prompt(tokenizer, p, n_vocab)
                    for p in raw)
    return CompletionsCall(str(body.get("model") or ""), prompts, logprobs)


def _position_top(prompt_piece: str, own_logprob: float, scores: TokenScores, k: int, piece) -> dict[str, float]:
    """The top-N tokens at one position and the prompt's own token (vLLM's top_logprobs entry)."""
    top: dict[str, float] = {}
    if scores.top_ids is not None:
        for token_id, logprob in zip(scores.top_ids[k], scores.top_logprobs[k], strict=True):
            top.setdefault(piece(int(token_id)), float(logprob))
    top.setdefault(prompt_piece, own_logprob)
    return top


def choice(index: int, prompt: Prompt, scores: TokenScores | None, logprobs: int | None, piece) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index, "text": prompt.text, "logprobs": None, "finish_reason": "length"}
    if logprobs is None:
        return out
    token_logprobs: list[float | None] = [None]
    top_logprobs: list[dict[str, float] | None] = [None]
    if scores is not None:
        for k, logprob in enumerate(scores.logprobs):
            token_logprobs.append(float(logprob))
            top_logprobs.append(_position_top(prompt.pieces[k + 1], float(logprob), scores, k, piece))
    out["logprobs"] = {"tokens": list(prompt.pieces), "token_logprobs": token_logprobs,
                       "top_logprobs": top_logprobs, "text_offset": list(prompt.offsets)}
    return out


def completions_response(call: CompletionsCall, scores: Sequence[TokenScores], served_model: str, piece) -> dict:
    """The answer to `call`, given the scores of its token_requests() in order."""
    remaining = iter(scores)
    choices = [choice(i, p, next(remaining) if len(p.ids) > 1 else None, call.logprobs, piece)
               for i, p in enumerate(call.prompts)]
    n_tokens = sum(len(p.ids) for p in call.prompts)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": call.model or served_model, "choices": choices,
            "usage": {"prompt_tokens": n_tokens, "completion_tokens": 0, "total_tokens": n_tokens}}
