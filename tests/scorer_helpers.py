"""Helpers shared by the scorer tests (their fixtures live in conftest.py): a counting fake backend over the real
SmolLM2 vocabulary, tokenizer folders with crafted templates/configs, and a scripted Decoder for banned-string tests."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from fake_backend import FakeBackend

from fastscore.backends.base import Decoder

SMOLLM_VOCAB = 49152


class CountingFakeBackend(FakeBackend):
    """The instrumented fake, also counting score_tokens calls and the requests in each."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**{"n_vocab": SMOLLM_VOCAB, "n_ctx": 512, "n_seq_max": 8, **kwargs})
        self.calls: list[int] = []

    def score_tokens(self, requests):
        self.calls.append(len(requests))
        return super().score_tokens(requests)


def copy_tokenizer(src: Path, dst: Path, *, template: str | None = None, config: Mapping | None = None) -> Path:
    """A copy of a tokenizer folder, optionally with chat_template.jinja and config overrides."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    if config:
        merged = {**json.loads((src / "tokenizer_config.json").read_text()), **config}
        (dst / "tokenizer_config.json").write_text(json.dumps(merged))
    if template is not None:
        (dst / "chat_template.jinja").write_text(template)
    return dst


# The Llama 3 chat template's control tokens, given the ids of SmolLM2 code-repository specials that chat never uses:
# the tiny models and the test tokenizers keep SmolLM2's vocabulary (and its size), yet the template's
# <|eot_id|> is a control token there, as in Llama 3's own vocabulary.
LLAMA3_SPECIALS = {"<repo_name>": "<|begin_of_text|>", "<reponame>": "<|start_header_id|>",
                   "<file_sep>": "<|end_header_id|>", "<filename>": "<|eot_id|>"}


def rename_special_tokens(folder: Path, renames: Mapping[str, str] = LLAMA3_SPECIALS) -> Path:
    """Give special tokens of a tokenizer folder new texts, in place (ids and vocabulary size unchanged)."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    for token in spec["added_tokens"]:
        token["content"] = renames.get(token["content"], token["content"])
    spec["model"]["vocab"] = {renames.get(t, t): i for t, i in spec["model"]["vocab"].items()}
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for token in config.get("added_tokens_decoder", {}).values():
        token["content"] = renames.get(token["content"], token["content"])
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return folder


class ScriptedDecoder(Decoder):
    """Logits keyed on the tokens generated so far: script[generated] lists preferred tokens, best first.

    Unscripted tokens share a low logit, so blocking the preferred ones moves the choice down the list.
    """

    def __init__(self, n_vocab: int, script: Mapping[tuple[int, ...], Sequence[int]], fallback: int) -> None:
        self.n_vocab, self.script, self.fallback = n_vocab, dict(script), fallback
        self.generated: list[list[int]] = []
        self.steps = 0

    def _row(self, generated: Sequence[int]) -> np.ndarray:
        row = np.full(self.n_vocab, -5.0, dtype=np.float32)
        row[self.fallback] = -1.0  # what the model says off-script
        for rank, token in enumerate(self.script.get(tuple(generated), ())):
            row[token] = 10.0 - rank
        return row

    def start(self, contexts):
        self.generated = [[] for _ in contexts]
        return np.stack([self._row(g) for g in self.generated])

    def step(self, active, tokens):
        self.steps += 1
        for seq, token in zip(active, tokens, strict=True):
            self.generated[seq].append(int(token))
        return np.stack([self._row(self.generated[seq]) for seq in active])
