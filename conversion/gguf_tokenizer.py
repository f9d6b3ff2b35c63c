"""Rebuild a GGUF's own tokenizer as a Hugging Face tokenizer folder.

transformers' GGUF loader rebuilds a GPT-2-style BPE vocab as a Llama/SentencePiece tokenizer (BOS added, byte
fallback, '▁' decoder), which tokenizes differently from llama.cpp. Here the tokenizer is built from the GGUF's
own metadata (tokens, merges, token types, special ids, pre-tokenizer name) with the `tokenizers` library, using
the exact pre-tokenizer regexes llama.cpp uses (src/llama-vocab.cpp), so both give the same ids.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from fastscore.deps import require
from fastscore.errors import TokenizationError

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# llama.cpp's token types (enum llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# tokenizer.ggml.pre -> the regexes llama.cpp applies in order (llama_vocab::impl::load, regex_exprs).
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    **{name: (r"\p{N}", _GPT2) for name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")},
    **{name: (_GPT2,) for name in ("gpt-2", "gpt2", "mpt", "olmo", "jais")},
}


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer metadata of a GGUF file."""

    model: str  # tokenizer.ggml.model, e.g. "gpt2" (byte-level BPE)
    pre: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    chat_template: str | None
    context_length: int | None

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]

    @property
    def special_ids(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.token_types) if t in (CONTROL, USER_DEFINED, UNKNOWN))


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_vocab(gguf_path: Path) -> GgufVocab:
    gguf = require("gguf", "tokenizer")
    reader = gguf.GGUFReader(str(gguf_path))
    arch = _field(reader, "general.architecture")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise TokenizationError(f"{gguf_path} has no tokenizer.ggml.tokens")
    return GgufVocab(
        model=_field(reader, "tokenizer.ggml.model", ""),
        pre=_field(reader, "tokenizer.ggml.pre", "default"),
        tokens=tuple(tokens),
        token_types=tuple(int(t) for t in _field(reader, "tokenizer.ggml.token_type", [NORMAL] * len(tokens))),
        merges=tuple(_field(reader, "tokenizer.ggml.merges", [])),
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        unk_id=_field(reader, "tokenizer.ggml.unknown_token_id"),
        pad_id=_field(reader, "tokenizer.ggml.padding_token_id"),
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=_field(reader, "tokenizer.chat_template"),
        context_length=_field(reader, f"{arch}.context_length"),
    )


def _pre_tokenizer(pre: str):
    tokenizers = require("tokenizers", "tokenizer")
    if pre not in PRE_TOKENIZER_REGEXES:
        raise TokenizationError(
            f"GGUF pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(PRE_TOKENIZER_REGEXES))}"
        )
    splits = []
    for expr in PRE_TOKENIZER_REGEXES[pre]:
        # llama.cpp's splitter falls back to `\s+` after `\s+(?!\S)` (as GPT-2's regex does); onig needs it spelt out.
        if expr.endswith(r"\s+(?!\S)"):
            expr += r"|\s+"
        splits.append(tokenizers.pre_tokenizers.Split(tokenizers.Regex(expr), behavior="isolated"))
    byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return tokenizers.pre_tokenizers.Sequence([*splits, byte_level])


def build_tokenizer(vocab: GgufVocab):
    """A `tokenizers.Tokenizer` giving the same ids as llama.cpp for this vocab (byte-level BPE only)."""
    tokenizers = require("tokenizers", "tokenizer")
    if vocab.model != "gpt2":
        raise TokenizationError(f"only byte-level BPE ('gpt2') GGUF vocabs are supported, not {vocab.model!r}")
    model = tokenizers.models.BPE(
        vocab={token: i for i, token in enumerate(vocab.tokens)},
        merges=[tuple(merge.split(" ", 1)) for merge in vocab.merges],
        fuse_unk=False,
        byte_fallback=False,
    )
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = _pre_tokenizer(vocab.pre)
    tok.decoder = tokenizers.decoders.ByteLevel()
    # Offsets are kept untrimmed so they cover the exact characters of each token (the scorer maps boundaries).
    tok.post_processor = tokenizers.processors.ByteLevel(trim_offsets=False)
    tok.add_tokens(
        [
            tokenizers.AddedToken(
                vocab.tokens[i],
                special=vocab.token_types[i] != USER_DEFINED,
                normalized=False,
                lstrip=False,
                rstrip=False,
                single_word=False,
            )
            for i in vocab.special_ids
        ]
    )
    return tok


def tokenizer_config(vocab: GgufVocab) -> dict:
    """tokenizer_config.json: no BOS is added (the GGUF says so), end of turn is the GGUF's eos."""
    added = {
        str(i): {
            "content": vocab.tokens[i],
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": vocab.token_types[i] != USER_DEFINED,
        }
        for i in vocab.special_ids
    }
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": vocab.token(vocab.eos_id),
        "pad_token": vocab.token(vocab.pad_id),
        "unk_token": vocab.token(vocab.unk_id),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(vocab.context_length or 2048),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return config


def special_tokens_map(vocab: GgufVocab) -> dict:
    out = {
        key: vocab.token(token_id)
        for key, token_id in (("eos_token", vocab.eos_id), ("pad_token", vocab.pad_id), ("unk_token", vocab.unk_id))
        if token_id is not None
    }
    chat_specials = [t for t in (vocab.token(vocab.bos_id), vocab.token(vocab.eos_id)) if t is not None]
    if chat_specials:
        out["additional_special_tokens"] = list(dict.fromkeys(chat_specials))
    return out


def write_tokenizer_dir(gguf_path: Path, out_dir: Path) -> GgufVocab:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json for the GGUF's vocab into out_dir."""
    vocab = read_vocab(gguf_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(vocab).save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(vocab), indent=2, ensure_ascii=False))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_tokens_map(vocab), indent=2))
    log.info("rebuilt the %s tokenizer of %s (%d tokens) in %s", vocab.pre, gguf_path.name, len(vocab.tokens), out_dir)
    return vocab


def load_tokenizer(tokenizer_dir: Path):
    """The rebuilt tokenizer as a `tokenizers.Tokenizer` (no transformers needed)."""
    tokenizers = require("tokenizers", "tokenizer")
    return tokenizers.Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
