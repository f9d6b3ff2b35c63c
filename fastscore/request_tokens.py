"""Text requests as token ids: the half of the Scorer that renders and tokenizes (no model call).

A request is (messages, continuation): the messages are rendered with the model's own chat template, the
continuation is the assistant's reply. The scored tokens are the continuation's tokens plus the template's
end-of-turn token right after it ("<|im_end|>" for ChatML, "<|eot_id|>" for Llama 3), so a score is the
probability of the reply *and of ending the turn there*; `include_end_of_turn=False` scores the reply alone.

Each full conversation is rendered once and tokenized once (one tokenizer for every backend); the continuation's
tokens are those whose characters overlap its character span. A token that crosses the context/continuation
boundary (BPE merged characters from both sides) is scored as part of the continuation and counted in
`ScoreResult.boundary_straddles`. Texts that cannot fit the backend's context are refused before tokenizing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fastscore import chat
from fastscore.errors import ContextTooLongError, RequestError, TokenizationError
from fastscore.records import ScoreRequest, TokenRequest

if TYPE_CHECKING:
    from fastscore.backends.base import Backend
    from fastscore.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class PreparedRequest:
    """A request as token ids: `token_request.tokens[score_from:]` are the scored tokens."""

    request: ScoreRequest
    token_request: TokenRequest
    boundary_straddles: int
    includes_end_of_turn: bool


class RequestTokenizer:
    """Turns chat and raw-text requests into token requests for `backend`'s context. The Scorer is one (it inherits
    these methods), so its settings — `include_end_of_turn`, `top_k`, the template kwargs — apply as they are set."""

    backend: Backend
    tokenizer: Tokenizer
    chat_template_kwargs: Mapping[str, Any]
    include_end_of_turn: bool
    top_k: int

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """At least the most bytes one token of this vocabulary stands for (the tokenizer's cheap bound if it has
        one, else the exact maximum over its decoded vocabulary)."""
        bound = getattr(self.tokenizer, "max_token_bytes", None)
        return max(1, bound if bound is not None else max(len(piece) for piece in self.tokenizer.token_bytes))

    @property
    def max_text_bytes(self) -> int:
        """A text of more bytes cannot fit the context: no token covers more than `max_token_bytes` of it."""
        return self.backend.n_ctx * self.max_token_bytes

    def context_limit(self) -> str:
        """The context a too-long request ran into, and what sets it (for ContextTooLongError messages)."""
        n_ctx, trained = self.backend.n_ctx, self.backend.n_ctx_train
        option = self.backend.context_option
        text = f"the backend's context of {n_ctx} tokens" + (f" (set by {option})" if option else "")
        if trained is None:
            return text
        text += f"; the model's limit is its trained context of {trained} tokens"
        return text + (f", so {option} up to {trained} can hold more" if option and trained > n_ctx else "")

    def _check_text_fits(self, text: str, rid: object, reserved: int = 0) -> None:
        """Before tokenizing: refuse a text that has more bytes than the context (less `reserved` tokens) can
        hold, so a huge request costs a byte count, not a tokenization of all of it. Lone surrogates (API strings)
        are refused here too: two halves given in separate strings are not joined into one character."""
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise RequestError(f"contains a lone surrogate ({exc.object[exc.start]!r}), which is not valid text",
                               request_id=rid) from None
        if size > (self.backend.n_ctx - reserved) * self.max_token_bytes:
            raise ContextTooLongError(
                f"the conversation is {size:,} bytes, more than {self.backend.n_ctx - reserved} tokens of at most "
                f"{self.max_token_bytes} bytes each can hold: longer than {self.context_limit()}", request_id=rid)

    @property
    def _template(self) -> str:
        # Required only by chat requests: a base model without a template still scores raw-text prompts.
        return self.tokenizer.require_chat_template()

    # --- tokens with exactly the BOS the model expects ---

    def _with_bos(self, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, request_id: object):
        bos = self.tokenizer.bos_id
        if bos is None:
            return ids, starts, ends
        leading = 0
        while leading < len(ids) and ids[leading] == bos:
            leading += 1
        if leading > 1:
            # The template wrote bos_token and it was written again: the model saw one BOS in training.
            log.warning("request %r: %d BOS tokens at the start, keeping one", request_id, leading)
            keep = slice(leading - 1, None)
            return ids[keep], starts[keep], ends[keep]
        if leading == 0 and self.tokenizer.add_bos:
            zero = np.zeros(1, dtype=np.int64)
            return np.concatenate([[bos], ids]), np.concatenate([zero, starts]), np.concatenate([zero, ends])
        return ids, starts, ends

    def context_ids(self, messages, request_id: object = None, tools=()) -> list[int]:
        """Token ids of the messages rendered with a generation prompt (the context greedy decoding continues)."""
        chat.check_messages(messages, request_id)
        chat.check_template_support(self._template, messages, tools, request_id)
        text, literal_spans = chat.render_literal(
            self._template,
            messages,
            self.tokenizer.special_texts,
            add_generation_prompt=True,
            special_tokens=self.tokenizer.special_token_variables,
            template_kwargs=self.chat_template_kwargs,
            request_id=request_id,
            tools=tools,
        )
        self._check_text_fits(text, request_id)
        enc = self.tokenizer.encode(text, literal_spans)
        ids, _, _ = self._with_bos(enc.ids, enc.starts, enc.ends, request_id)
        return [int(i) for i in ids]

    def prompt_ids(self, prompt: str, request_id: object = None) -> list[int]:
        """Token ids of a raw-text prompt, tokenized as a raw-text request's context is (the context greedy
        decoding continues without a template)."""
        rendered = chat.raw_text(prompt, "")
        self._check_text_fits(rendered.text, request_id)
        enc = self.tokenizer.encode(rendered.text, rendered.literal_spans)
        ids, _, _ = self._with_bos(enc.ids, enc.starts, enc.ends, request_id)
        if len(ids) == 0:
            raise RequestError("an empty prompt needs a BOS token, which this model does not add: nothing to continue",
                               request_id=request_id)
        return [int(i) for i in ids]

    def prepare(self, request: ScoreRequest) -> PreparedRequest:
        """Render, tokenize and locate the scored tokens of one request (no model call)."""
        rid = request.id
        if request.continuation_ids is not None:
            return self._prepare_emitted(request)
        if not request.continuation:
            raise RequestError("empty continuation: there is nothing to score", request_id=rid)
        if request.prompt is not None:
            rendered = chat.raw_text(request.prompt, request.continuation)
        else:
            chat.check_messages(request.messages, rid)
            rendered = chat.render_with_continuation(
                self._template,
                request.messages,
                request.continuation,
                special_tokens=self.tokenizer.special_token_variables,
                template_kwargs=self.chat_template_kwargs,
                request_id=rid,
                literal_texts=self.tokenizer.special_texts,
                tools=request.tools,
            )
        self._check_text_fits(rendered.text, rid)
        enc = self.tokenizer.encode(rendered.text, rendered.literal_spans)
        ids, starts, ends = self._with_bos(enc.ids, enc.starts, enc.ends, rid)
        lo, hi = rendered.start, rendered.end
        overlaps = ((starts < hi) & (ends > lo)) | ((starts == ends) & (starts > lo) & (starts < hi))
        inside = np.flatnonzero(overlaps)
        if inside.size == 0:
            raise TokenizationError(f"request {rid!r}: no token covers the continuation")
        first, last = int(inside[0]), int(inside[-1])
        if first == 0:
            raise TokenizationError(f"request {rid!r}: the rendered conversation has no token before the continuation"
                                    + (" (an empty prompt needs a BOS token)" if request.prompt is not None else ""))
        # Boundaries crossed: the first scored token may start in the context, the last may run into the template.
        straddles = int(starts[first] < lo) + int(ends[last] > hi)
        end = last + 1
        with_end_of_turn = self._end_of_turn(request)
        if with_end_of_turn:
            eot = self.tokenizer.end_of_turn_id
            if end >= len(ids) or int(ids[end]) != eot:
                found = self.tokenizer.decode(ids[end : end + 1]) if end < len(ids) else "end of text"
                raise TokenizationError(
                    f"request {rid!r}: expected the end-of-turn token {self.tokenizer.decode([eot])!r} right after "
                    f"the continuation, found {found!r}"
                )
            end += 1
        if end > self.backend.n_ctx:
            raise ContextTooLongError(
                f"the conversation is {end} tokens ({first} of context + {end - first} scored), "
                f"longer than {self.context_limit()}",
                request_id=rid,
            )
        token_request = TokenRequest(tokens=tuple(int(i) for i in ids[:end]), score_from=first, top_k=self.top_k)
        return PreparedRequest(request, token_request, straddles, with_end_of_turn)

    def _end_of_turn(self, request: ScoreRequest) -> bool:
        wanted = self.include_end_of_turn if request.end_of_turn is None else request.end_of_turn
        return wanted and request.prompt is None  # raw text has no turn to end

    def _prepare_emitted(self, request: ScoreRequest) -> PreparedRequest:
        """Token ids a model emitted, scored right after the context it was decoded from (the messages with the
        generation prompt, as greedy decoding renders them): no re-tokenisation, so no boundary to straddle."""
        rid = request.id
        if not request.continuation_ids:
            raise RequestError("empty continuation: there is nothing to score", request_id=rid)
        context = (self.prompt_ids(request.prompt, rid) if request.prompt is not None
                   else self.context_ids(request.messages, rid, request.tools))
        with_end_of_turn = self._end_of_turn(request)
        tokens = [*context, *(int(t) for t in request.continuation_ids)]
        tokens += [self.tokenizer.end_of_turn_id] if with_end_of_turn else []
        if len(tokens) > self.backend.n_ctx:
            raise ContextTooLongError(f"the conversation is {len(tokens)} tokens ({len(context)} of context + "
                                      f"{len(tokens) - len(context)} scored), longer than {self.context_limit()}",
                                      request_id=rid)
        return PreparedRequest(request, TokenRequest(tuple(tokens), len(context), self.top_k), 0, with_end_of_turn)
