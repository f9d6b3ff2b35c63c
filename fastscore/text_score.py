"""Unconditional scoring of raw text: every token's log-prob given the text before it, and the perplexity.

No chat template: the text is tokenized as it is (special-token text stays text). The first token is predicted from
the model's BOS token, or from its end-of-text token when it has no BOS (as lm-evaluation-harness's rolling
log-likelihood does), so every token of the text is scored. A text longer than the backend's context is scored in
overlapping windows: each window scores `stride` new tokens given the tokens before them that fit in the context.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastscore.errors import BackendError, RequestError, TokenizationError
from fastscore.records import TokenRequest


@dataclass(frozen=True)
class TextScore:
    token_ids: tuple[int, ...]
    token_texts: tuple[str, ...]
    token_logprobs: tuple[float, ...]  # natural log
    context_token: str  # the token the first one is predicted from
    window: int  # tokens per model call (the context)
    stride: int  # new tokens scored per window after the first

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def logprob(self) -> float:
        return float(np.sum(self.token_logprobs, dtype=np.float64))

    @property
    def perplexity(self) -> float:
        return math.exp(-self.logprob / self.n_tokens)

    def to_dict(self) -> dict:
        return {
            "n_tokens": self.n_tokens, "logprob": self.logprob, "perplexity": self.perplexity,
            "nats_per_token": -self.logprob / self.n_tokens, "context_token": self.context_token,
            "window": self.window, "stride": self.stride,
            "tokens": [{"id": i, "text": t, "logprob": lp}
                       for i, t, lp in zip(self.token_ids, self.token_texts, self.token_logprobs, strict=True)],
        }

    def line(self) -> str:
        return (f"{self.n_tokens} tokens, log-prob {self.logprob:.4f} nats ({-self.logprob / self.n_tokens:.4f} per "
                f"token), perplexity {self.perplexity:.4f}")


def context_token_id(tokenizer) -> int:
    """The BOS token, else the end-of-text (eos) token: what the first token of a text is predicted from."""
    for token_id in (tokenizer.bos_id, tokenizer.eos_id):
        if token_id is not None:
            return int(token_id)
    raise TokenizationError("this model has neither a BOS nor an end-of-text token to predict a text's first token "
                            "from")


def windows(n_text: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, score_from, end) offsets into [context token] + text: each window holds at most `window` tokens and
    scores tokens[score_from:end]; together they score every text token once (positions 1..n_text)."""
    if window < 2 or not 1 <= stride <= window - 1:
        raise ValueError(f"need window >= 2 and 1 <= stride < window (got {window}, {stride})")
    spans, scored = [], 1
    while scored <= n_text:
        end = min(n_text + 1, scored + (window - 1 if scored == 1 else stride))
        spans.append((max(0, end - window), scored, end))
        scored = end
    return spans


def score_text(scorer, text: str, *, window: int | None = None, stride: int | None = None) -> TextScore:
    """Every token of `text` scored unconditionally with `scorer`'s backend (see the module's docstring).

    `window` defaults to the backend's context; `stride` to half of it."""
    if not text:
        raise RequestError("the text is empty: there is nothing to score")
    tokenizer = scorer.tokenizer
    ids = [int(i) for i in tokenizer.encode(text, ((0, len(text)),)).ids]
    first = context_token_id(tokenizer)
    tokens = [first, *ids]
    window = window or scorer.backend.n_ctx
    stride = stride or max(1, window // 2)
    requests = [TokenRequest(tuple(tokens[start:end]), score_from - start)
                for start, score_from, end in windows(len(ids), window, stride)]
    scores = scorer.score_token_requests(requests)
    logprobs = np.concatenate([np.asarray(s.logprobs, dtype=np.float64) for s in scores])
    if logprobs.shape != (len(ids),):
        raise BackendError(f"the backend returned {logprobs.shape[0]} log-probs for a text of {len(ids)} tokens")
    return TextScore(tuple(ids), tuple(tokenizer.decode_piece(i) for i in ids), tuple(float(x) for x in logprobs),
                     tokenizer.decode_piece(first), window, stride)


@dataclass(frozen=True)
class TextRun:
    score: TextScore
    model: str
    quant: str


def read_text_arg(value: str) -> str:
    """--text's value: '-' reads stdin, an existing file's path reads the file (UTF-8), anything else is the text."""
    if value == "-":
        return sys.stdin.read()
    try:
        path = Path(value).expanduser()
        is_file = path.is_file()
    except (OSError, ValueError):  # a long text is not a valid path
        is_file = False
    if not is_file:
        return value
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"{path} is not UTF-8 text ({exc})") from None


def run_text(text_arg: str, out, *, model: str | None, backend: str, quant: str | None, hf_path=None,
             threads: int | None = None, backend_options=(), n_ctx: int | None = None, command: str = "") -> TextRun:
    """`fastscore score --text`: score the text and write the JSON (with the run's metadata) to `out` or stdout."""
    from fastscore import outputs, provenance
    from fastscore.selection import ModelSelection

    text = read_text_arg(text_arg)
    if not text:
        raise RequestError("the text is empty: there is nothing to score")
    if out is not None and not outputs.is_stdio(out):
        outputs.ensure_parent(out)
    selection = ModelSelection.resolve(model, backend, quant, hf_path=hf_path, threads=threads,
                                       backend_options=backend_options, n_ctx=n_ctx)
    with selection.open(progress=True) as scorer:
        result = score_text(scorer, text)
        meta = provenance.run_metadata(scorer, model=selection.model, backend=backend, quant=selection.quant,
                                       backend_options=selection.options, command=command,
                                       extra={"text_chars": len(text)})
    body = json.dumps({**result.to_dict(), "meta": meta}, ensure_ascii=False, indent=1) + "\n"
    if out is None or outputs.is_stdio(out):
        sys.stdout.write(body)
        sys.stdout.flush()
    else:
        outputs.write_text_atomic(Path(out), body)
    return TextRun(result, selection.model, selection.quant)
