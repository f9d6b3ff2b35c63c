"""Banned texts, enforced on text whatever tokens spell them: which token ids would complete a banned text
(TextBan) or start with one (PrefixBan), given the bytes generated so far (see fastscore.decode)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from functools import lru_cache

import numpy as np

from fastscore.mathops import softmax


class TextBan:
    """Which token ids would complete one of a set of banned texts, given the bytes generated so far."""

    def __init__(self, token_bytes: Sequence[bytes], stop_ids: Iterable[int], n_vocab: int) -> None:
        self.stop_ids = np.array(sorted(stop_ids), dtype=np.int64)
        stops = set(self.stop_ids.tolist())
        self._by_strip: dict[bytes, list[int]] = defaultdict(list)
        self._by_rstrip: dict[bytes, list[int]] = defaultdict(list)
        blank = []
        for token_id in range(n_vocab):
            if token_id in stops:
                continue
            piece = token_bytes[token_id] if token_id < len(token_bytes) else b""
            stripped = piece.strip()
            if stripped:
                self._by_strip[stripped].append(token_id)
                self._by_rstrip[piece.rstrip()].append(token_id)
            else:
                blank.append(token_id)
        self._blank = np.array(blank, dtype=np.int64)  # whitespace-only tokens: they leave the stripped text as is

    def blocked(self, text: bytes, banned: frozenset[bytes], final_step: bool) -> np.ndarray:
        """Token ids to block after `text`; `banned` holds stripped banned texts; `final_step`: this token is the last.

        Not at the final step, only a stop token can complete the text. At the final step any token does.
        """
        if not banned:
            return self.stop_ids[:0]
        matches_now = text.strip() in banned
        parts = [self.stop_ids] if matches_now else []
        if final_step:
            if matches_now:
                parts.append(self._blank)
            head = text.lstrip()
            for key in banned:
                if not head:  # only whitespace so far: the token alone must spell the banned text
                    parts.append(np.array(self._by_strip.get(key, ()), dtype=np.int64))
                elif len(key) > len(head) and key.startswith(head):
                    parts.append(np.array(self._by_rstrip.get(key[len(head) :], ()), dtype=np.int64))
        if not parts:
            return self.stop_ids[:0]
        return np.unique(np.concatenate(parts))


class PrefixBan:
    """Which token ids would make the text generated so far start with a banned text (after leading whitespace)."""

    def __init__(self, token_bytes: Sequence[bytes], stop_ids: Iterable[int], n_vocab: int) -> None:
        stops = set(int(i) for i in stop_ids)
        pieces = [(token_bytes[i] if i < len(token_bytes) else b"", i) for i in range(n_vocab) if i not in stops]
        # Sorted pieces: the tokens starting with some bytes are one contiguous run, found by bisection.
        self._pieces = sorted((piece, i) for piece, i in pieces if piece)
        self._leading = sorted((piece.lstrip(), i) for piece, i in pieces if piece.strip())

    @staticmethod
    def _starting_with(index: list[tuple[bytes, int]], prefix: bytes) -> list[int]:
        out, k = [], bisect.bisect_left(index, (prefix, -1))
        while k < len(index) and index[k][0].startswith(prefix):
            out.append(index[k][1])
            k += 1
        return out

    def blocked(self, text: bytes, banned: frozenset[bytes], final_step: bool) -> np.ndarray:
        head = text.lstrip()
        found: list[int] = []
        for key in banned:
            if not head:  # only whitespace so far: a token that (after its own whitespace) spells the key
                found += self._starting_with(self._leading, key)
            elif len(key) > len(head) and key.startswith(head):
                found += self._starting_with(self._pieces, key[len(head) :])
        return np.unique(np.array(found, dtype=np.int64))


@lru_cache(maxsize=4)
def prefix_ban(token_bytes: tuple[bytes, ...], stop_ids: frozenset[int], n_vocab: int) -> PrefixBan:
    return PrefixBan(token_bytes, stop_ids, n_vocab)


@lru_cache(maxsize=4)
def text_ban(token_bytes: tuple[bytes, ...], stop_ids: frozenset[int], n_vocab: int) -> TextBan:
    """The ban index of a vocabulary, built once per tokenizer (a pass over every token)."""
    return TextBan(token_bytes, stop_ids, n_vocab)


def softmax_mass(logits: np.ndarray, ids: np.ndarray) -> float:
    return float(softmax(logits)[ids].sum())


def ban_may_act(text: bytes, banned: frozenset[bytes]) -> bool:
    """Could a ban still block a token after `text` or any longer text? Only while the stripped text is a prefix of
    a banned text: every later text, stripped, starts with this one stripped."""
    head = text.strip()
    return any(key.startswith(head) for key in banned)
