"""Item-level error isolation: one call over many items' requests, retried without the item that caused an error.

An item-level problem (a context longer than the model's window, a conversation the template rejects) removes that
item, with a countable reason; the run goes on with the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from fastscore.errors import ContextTooLongError, RequestError, TokenizationError

log = logging.getLogger(__name__)

ITEM_LEVEL_ERRORS = (RequestError, TokenizationError)

Req = TypeVar("Req")
Res = TypeVar("Res")


def error_reason(exc: Exception) -> str:
    """A countable reason (the details go to item_errors.jsonl)."""
    if isinstance(exc, ContextTooLongError):
        return "context too long for the model"
    if isinstance(exc, TokenizationError):
        return "tokenization failed"
    return "the scorer rejected the request"


def chunks(seq: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for lo in range(0, len(seq), size):
        yield seq[lo : lo + size]


def call_isolating(
    call: Callable[[list[Req]], list[Res]], requests: dict[str, list[Req]], request_id: Callable[[Req], str]
) -> tuple[dict[str, list[Res]], dict[str, Exception]]:
    """`call` on every item's requests at once; an item-level error removes the item that caused it, then retries.

    Returns results per item (in its requests' order) and the error of each item that failed.
    """
    pending = dict(requests)
    failed: dict[str, Exception] = {}
    while pending:
        flat = [r for reqs in pending.values() for r in reqs]
        try:
            results = call(flat)
        except ITEM_LEVEL_ERRORS as exc:
            owner = {request_id(r): key for key, reqs in pending.items() for r in reqs}
            culprit = owner.get(getattr(exc, "request_id", None))
            if culprit is None and len(pending) > 1:
                # The error names no request of ours: find the item by calling each one alone.
                done: dict[str, list[Res]] = {}
                for key, reqs in pending.items():
                    ok, bad = call_isolating(call, {key: reqs}, request_id)
                    done.update(ok)
                    failed.update(bad)
                return done, failed
            culprit = culprit if culprit is not None else next(iter(pending))
            log.warning("item %s: %s", culprit, exc)
            failed[culprit] = exc
            del pending[culprit]
            continue
        it = iter(results)
        return {key: [next(it) for _ in reqs] for key, reqs in pending.items()}, failed
    return {}, failed
