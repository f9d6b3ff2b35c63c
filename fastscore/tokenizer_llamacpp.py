"""The fallback tokenizer: llama.cpp's own, for a GGUF whose pre-tokenizer fastscore cannot rebuild.

fastscore normally rebuilds a GGUF's tokenizer for the `tokenizers` library (conversion/gguf_tokenizer.py), which
knows the regexes of a few pre-tokenizers only. For any other (Qwen2's, Llama 3's, ...) the local-GGUF path keeps
llama.cpp's tokenizer itself: the ids are by construction the ones the llama.cpp backend would produce, and each
token's character span is read from its piece (the pieces of a byte-level BPE vocabulary spell the text byte for
byte; a vocabulary whose pieces do not, e.g. SentencePiece with a space prefix, is refused with a message).
Special tokens are parsed as specials except inside literal spans (user content), as the main Tokenizer does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from fastscore.deps import require
from fastscore.errors import TokenizationError
from fastscore.tokenizer import Encoding, Tokenizer

log = logging.getLogger(__name__)

POINTER_FILE = "llamacpp_tokenizer.json"  # in a tokenizer folder: {"gguf": path} instead of tokenizer.json


def write_pointer(folder: Path, gguf_path: Path) -> None:
    (Path(folder) / POINTER_FILE).write_text(json.dumps({"gguf": str(Path(gguf_path).resolve())}) + "\n")


def _overlaps(start: int, end: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(start < b and end > a for a, b in ranges)


class LlamaCppTokenizer(Tokenizer):
    """Tokenizer's interface on llama.cpp's vocabulary of one GGUF file (its weights are not loaded)."""

    def __init__(self, gguf_path: Path, name: str = "") -> None:  # noqa: D107 (no super().__init__: no tokenizers)
        llama_cpp = require("llama_cpp", "llamacpp", package="llama-cpp-python")
        self.gguf_path = Path(gguf_path)
        if not self.gguf_path.is_file():
            raise TokenizationError(f"the GGUF file {gguf_path} of this tokenizer is gone")
        self._llm = llama_cpp.Llama(str(self.gguf_path), vocab_only=True, verbose=False)
        model = self._llm._model
        n_vocab = self._llm.n_vocab()
        self._pieces = tuple(model.detokenize([i], special=True) for i in range(n_vocab))
        parsed = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        attrs = [model.token_get_attr(i) for i in range(n_vocab)]
        self.special_ids = frozenset(i for i, a in enumerate(attrs) if a & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL)
        self._parsed_ids = frozenset(i for i, a in enumerate(attrs) if a & parsed)  # what special=True parses
        meta = self._llm.metadata
        self.name = name or str(self.gguf_path)
        self.chat_template = meta.get("tokenizer.chat_template")
        self.bos_id, self.eos_id = self._llm.token_bos(), self._llm.token_eos()
        self.bos_id = self.bos_id if 0 <= self.bos_id < n_vocab else None
        self.eos_id = self.eos_id if 0 <= self.eos_id < n_vocab else None
        self.bos_token = self.decode_piece(self.bos_id) if self.bos_id is not None else None
        self.eos_token = self.decode_piece(self.eos_id) if self.eos_id is not None else None
        self.add_bos = meta.get("tokenizer.ggml.add_bos_token", "false") == "true" and self.bos_id is not None
        self.config = {k: v for k, v in (("bos_token", self.bos_token), ("eos_token", self.eos_token)) if v}
        log.info("tokenizing with llama.cpp's own tokenizer of %s", self.gguf_path.name)

    @classmethod
    def from_pointer(cls, folder: Path) -> "LlamaCppTokenizer":
        return cls(Path(json.loads((Path(folder) / POINTER_FILE).read_text())["gguf"]), name=str(folder))

    def _id_of(self, token: str | None) -> int | None:
        ids = self._tokenize(token, special=True) if token else []
        return ids[0] if len(ids) == 1 else None

    def _tokenize(self, text: str, special: bool) -> list[int]:
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)) if text else []

    @cached_property
    def special_texts(self) -> tuple[str, ...]:
        texts = {self.decode_piece(i) for i in self._parsed_ids}
        return tuple(sorted((t for t in texts if t), key=lambda t: (-len(t), t)))

    def _spans(self, text: str, ids: Sequence[int]) -> np.ndarray:
        """[start, end) character span of each token, from the byte length of its piece."""
        data = text.encode("utf-8")
        lengths = np.array([len(self._pieces[i]) for i in ids], dtype=np.int64)
        if b"".join(self._pieces[i] for i in ids) != data:
            raise TokenizationError(f"llama.cpp's tokenizer of {self.gguf_path.name} does not spell the text byte "
                                    "for byte (e.g. a SentencePiece space prefix): token spans cannot be located")
        byte_ends = np.cumsum(lengths)
        char_starts = np.cumsum([0] + [len(ch.encode("utf-8")) for ch in text])[:-1]
        starts = np.searchsorted(char_starts, byte_ends - lengths, side="right") - 1
        ends = np.searchsorted(char_starts, byte_ends, side="left")
        return np.stack([np.maximum(starts, 0), ends], axis=1).astype(np.int64).reshape(-1, 2)

    def encode(self, text: str, literal_spans: Sequence[tuple[int, int]] = ()) -> Encoding:
        ids = self._tokenize(text, special=True)
        spans = self._spans(text, ids)
        inside = {k for k, t in enumerate(ids) if t in self._parsed_ids and _overlaps(*spans[k], literal_spans)}
        if inside:  # special-token text in user content: re-encode the text between the template's specials
            kept = [k for k, t in enumerate(ids) if t in self._parsed_ids and k not in inside]
            pieces, cursor = [], 0
            for k in [*kept, None]:
                start = len(text) if k is None else int(spans[k][0])
                pieces += self._tokenize(text[cursor:start], special=False)
                if k is not None:
                    pieces.append(ids[k])
                    cursor = int(spans[k][1])
            ids = pieces
            spans = self._spans(text, ids)
        ids_array = np.asarray(ids, dtype=np.int64)
        return Encoding(ids_array, spans[:, 0].copy(), spans[:, 1].copy())

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        data = b"".join(self._pieces[int(i)] for i in ids if not (skip_special_tokens and int(i) in self.special_ids))
        return data.decode("utf-8", errors="replace")

    def decode_piece(self, token_id: int) -> str:
        return self._pieces[int(token_id)].decode("utf-8", errors="replace")

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def token_text(self, token_id: int) -> str:
        return self.decode_piece(token_id)

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...]:
        return self._pieces
