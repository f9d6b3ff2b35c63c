"""One tokenizer for every backend: a Hugging Face tokenizer folder read with the `tokenizers` library.

`Tokenizer.from_folder(dir)` reads tokenizer.json, tokenizer_config.json and chat_template.jinja (newer transformers
writes the template there). Encoding parses special tokens written by the chat template as specials, but not special
token text inside message contents or candidates (`literal_spans`): a literal "<|im_end|>" in a message is its
characters, as llama.cpp's tokenizer reads it with parse_special=False, so content cannot inject chat structure.
It adds no BOS (the scorer decides, see `add_bos`) and keeps untrimmed character offsets, so each token's span
covers exactly its characters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from fastscore import chat
from fastscore.deps import require
from fastscore.errors import DamagedArtefactError, TokenizationError

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Encoding:
    """Token ids and each token's [start, end) character span in the encoded text."""

    ids: np.ndarray  # int64
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.ids)


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value


def _overlaps(span: np.ndarray, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(span[0] < end and span[1] > start for start, end in ranges)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def _read_chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = config.get("chat_template")
    if template is None and (folder / "chat_template.json").is_file():
        template = json.loads((folder / "chat_template.json").read_text()).get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        by_name = {entry["name"]: entry["template"] for entry in template}
        template = by_name.get("default", next(iter(by_name.values()), None))
    return template


class Tokenizer:
    """Text <-> token ids for one model, plus the chat-template facts the scorer needs."""

    def __init__(self, backend_tokenizer, config: Mapping[str, Any], chat_template: str | None, name: str = "") -> None:
        self._tok = backend_tokenizer
        self.config = dict(config)
        self.chat_template = chat_template
        self.name = name
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        self.bos_id = self._id_of(self.bos_token)
        self.eos_id = self._id_of(self.eos_token)
        self.add_bos = self._detect_add_bos()
        # The scorer adds the BOS itself; the post-processor would also trim offsets (ByteLevel trim_offsets).
        self._tok.post_processor = None
        self.special_ids = frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    @classmethod
    def from_folder(cls, folder: Path | str) -> "Tokenizer":
        folder = Path(folder)
        if not (folder / "tokenizer.json").is_file() and (folder / "llamacpp_tokenizer.json").is_file():
            from fastscore.tokenizer_llamacpp import LlamaCppTokenizer  # a GGUF fastscore cannot rebuild

            return LlamaCppTokenizer.from_pointer(folder)
        tokenizers = require("tokenizers", "tokenizer")
        if not (folder / "tokenizer.json").is_file():
            raise TokenizationError(f"{folder} has no tokenizer.json")
        config_file = folder / "tokenizer_config.json"
        try:
            config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
            if not isinstance(config, dict):
                raise ValueError(f"expected a JSON object, got {type(config).__name__}")
        except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise DamagedArtefactError(f"{config_file} is damaged: it cannot be read ({exc})") from exc
        try:
            backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
            template = _read_chat_template(folder, config)
        except Exception as exc:  # `tokenizers` raises a bare Exception for a file it cannot parse
            raise DamagedArtefactError(f"the tokenizer in {folder} is damaged: it cannot be read ({exc})") from exc
        return cls(backend, config, template, name=str(folder))

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def _detect_add_bos(self) -> bool:
        if "add_bos_token" in self.config:
            return bool(self.config["add_bos_token"]) and self.bos_id is not None
        # No explicit flag (e.g. Llama 3): the post-processor's template says whether a BOS is prepended.
        with_specials = self._tok.encode("a", add_special_tokens=True).ids
        return self.bos_id is not None and bool(with_specials) and with_specials[0] == self.bos_id

    # --- text <-> ids ---

    @cached_property
    def special_texts(self) -> tuple[str, ...]:
        """The texts the tokenizer parses as control tokens (special added tokens), longest first."""
        texts = {t.content for i, t in self._tok.get_added_tokens_decoder().items() if i in self.special_ids}
        return tuple(sorted(texts, key=lambda t: (-len(t), t)))

    def encode(self, text: str, literal_spans: Sequence[tuple[int, int]] = ()) -> Encoding:
        """Ids of `text`, no BOS added, untrimmed char offsets. Special-token text is parsed as the special token,
        except inside `literal_spans` ([start, end) character ranges: user content), where it stays plain text."""
        enc = self._tok.encode(text, add_special_tokens=False)
        ids = np.asarray(enc.ids, dtype=np.int64)
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        if literal_spans:
            special = [k for k, token in enumerate(enc.ids) if token in self.special_ids]
            inside = [k for k in special if _overlaps(offsets[k], literal_spans)]
            if inside:
                ids, offsets = self._encode_around(text, [k for k in special if k not in inside], ids, offsets)
        return Encoding(ids, offsets[:, 0].copy(), offsets[:, 1].copy())

    def _encode_around(self, text: str, kept: Sequence[int], ids: np.ndarray, offsets: np.ndarray):
        """Re-encode the text between the kept special tokens with special-token parsing off. `tokenizers` itself
        splits at every special token and encodes the pieces apart, so merges across the pieces never existed."""
        pieces_ids, pieces_offsets, cursor = [], [], 0
        bounds = [(int(offsets[k, 0]), int(offsets[k, 1]), k) for k in kept] + [(len(text), len(text), None)]
        self._tok.encode_special_tokens = True
        try:
            for start, end, k in bounds:
                if start > cursor:
                    piece = self._tok.encode(text[cursor:start], add_special_tokens=False)
                    pieces_ids.append(np.asarray(piece.ids, dtype=np.int64))
                    pieces_offsets.append(np.asarray(piece.offsets, dtype=np.int64).reshape(-1, 2) + cursor)
                if k is not None:
                    pieces_ids.append(ids[k : k + 1])
                    pieces_offsets.append(offsets[k : k + 1])
                cursor = max(cursor, end)
        finally:
            self._tok.encode_special_tokens = False
        return np.concatenate(pieces_ids), np.concatenate(pieces_offsets)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def decode_piece(self, token_id: int) -> str:
        """One token's text as it reads in the decoded string (a token holding part of a UTF-8 character decodes
        to U+FFFD; its id says which bytes)."""
        return self._tok.decode([int(token_id)], skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        return self._tok.id_to_token(int(token_id)) or ""

    @cached_property
    def max_token_bytes(self) -> int:
        """An upper bound of the bytes one token stands for, cheap (no decoding of the vocabulary): each entry's text
        in UTF-8, which takes at least as many bytes as what it stands for (a byte-level character 1-2 bytes for 1,
        SentencePiece's "\u2581" 3 for a space, "<0x41>" 6 for 1). SmolLM2: 162 (its longest token is 81 bytes)."""
        return max(len(piece.encode("utf-8")) for piece in self._tok.get_vocab(with_added_tokens=True))

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...]:
        """The exact bytes each token id stands for (specials: their text), so banned strings compare on text."""
        spec = json.loads(self._tok.to_str())
        byte_level = "ByteLevel" in json.dumps(spec.get("decoder")) or "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
        added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        inverse = {c: b for b, c in _bytes_to_unicode().items()}
        out = []
        for token_id in range(self.vocab_size):
            piece = self._tok.id_to_token(token_id)
            if piece is None:
                out.append(b"")
            elif token_id in added:
                out.append(added[token_id].encode())
            elif byte_level and all(ch in inverse for ch in piece):
                out.append(bytes(inverse[ch] for ch in piece))
            elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # SentencePiece byte fallback
                out.append(bytes([int(piece[3:5], 16)]))
            else:
                out.append(piece.replace("\u2581", " ").encode())
        return tuple(out)

    # --- chat template facts ---

    @property
    def special_token_variables(self) -> dict[str, str | None]:
        """The variables transformers gives templates: bos_token, eos_token, unk_token, pad_token (those set;
        an unset one stays undefined in the template and renders empty, not as "None")."""
        names = ("bos_token", "eos_token", "unk_token", "pad_token")
        values = {name: _token_content(self.config.get(name)) for name in names}
        return {name: value for name, value in values.items() if value is not None}

    def require_chat_template(self) -> str:
        if not self.chat_template:
            raise TokenizationError(f"the tokenizer in {self.name or 'memory'} has no chat template")
        return self.chat_template

    @cached_property
    def end_of_turn_id(self) -> int:
        """The token the template closes an assistant turn with ("<|im_end|>" ChatML, "<|eot_id|>" Llama 3).

        Read from what the template writes right after an assistant reply; the config's eos when that is not a
        special token.
        """
        if self.chat_template:
            after = chat.text_after_assistant_content(self.chat_template, special_tokens=self.special_token_variables)
            ids = self.encode(after).ids
            if len(ids) and int(ids[0]) in self.special_ids:
                return int(ids[0])
        if self.eos_id is None:
            raise TokenizationError("cannot tell the end-of-turn token: no template closing token and no eos_token")
        return self.eos_id

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens that end a generated reply: the end-of-turn token and the eos."""
        return frozenset(i for i in (self.end_of_turn_id, self.eos_id) if i is not None)
