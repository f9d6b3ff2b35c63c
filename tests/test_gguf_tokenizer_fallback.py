"""A local GGUF whose pre-tokenizer fastscore cannot rebuild is tokenized by llama.cpp's own tokenizer."""

from __future__ import annotations

import shutil

import pytest

import fastscore
from fastscore.records import Message, ScoreRequest
from fastscore.resolve import resolve
from fastscore.tokenizer import Tokenizer
from fastscore.tokenizer_llamacpp import LlamaCppTokenizer

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def foreign_gguf(tiny_artefact, tmp_path_factory):
    """The tiny model's GGUF with its pre-tokenizer renamed to one llama.cpp knows and fastscore does not
    (same length, patched in place: the file stays valid)."""
    original = tiny_artefact("llama", "llamacpp", "f32").path
    patched = tmp_path_factory.mktemp("foreign") / "foreign.gguf"
    data = bytearray(original.read_bytes())
    key = data.index(b"tokenizer.ggml.pre")
    at = data.index(b"smollm", key)
    data[at : at + 6] = b"gpt-4o"
    patched.write_bytes(bytes(data))
    return original, patched


def test_an_unknown_pre_tokenizer_falls_back_to_llama_cpp(foreign_gguf):
    original, patched = foreign_gguf
    artefact = resolve(str(patched), "llamacpp", "f32", progress=False)
    tok = Tokenizer.from_folder(artefact.tokenizer_dir)
    assert isinstance(tok, LlamaCppTokenizer)
    rebuilt = Tokenizer.from_folder(resolve(str(original), "llamacpp", "f32", progress=False).tokenizer_dir)
    text = "<|im_start|>user\nHello there, world<|im_end|>\n"
    enc, ref = tok.encode(text), rebuilt.encode(text)
    assert enc.ids.tolist() == ref.ids.tolist()  # plain words split alike under both regexes
    assert enc.starts.tolist() == ref.starts.tolist() and enc.ends.tolist() == ref.ends.tolist()
    assert tok.end_of_turn_id == rebuilt.end_of_turn_id and tok.chat_template == rebuilt.chat_template
    # Special-token text inside user content stays text, as with the main tokenizer.
    literal = tok.encode(text, literal_spans=[(17, 22)])
    assert literal.ids.tolist() == ref.ids.tolist()
    spoof = "user: <|im_end|> x"
    assert tok.encode(spoof, [(0, len(spoof))]).ids.tolist() == rebuilt.encode(spoof, [(0, len(spoof))]).ids.tolist()


def test_a_foreign_gguf_scores_end_to_end(foreign_gguf):
    original, patched = foreign_gguf
    request = {"messages": [{"role": "user", "content": "Name a colour."}], "candidates": ["Blue", "Red sky"]}
    with fastscore.load(str(patched), threads=2) as foreign, fastscore.load(str(original), threads=2) as known:
        [a], [b] = foreign.score_many([request]), known.score_many([request])
        ids = foreign.scorer.context_ids((Message("user", "Name a colour."),))
        assert ids == known.scorer.context_ids((Message("user", "Name a colour."),))
        assert foreign.scorer.prepare(ScoreRequest("r", (Message("user", "x"),), "Blue")).includes_end_of_turn
    for x, y in zip(a.results, b.results, strict=True):
        assert x.token_ids == y.token_ids and x.token_logprobs == pytest.approx(y.token_logprobs, abs=1e-6)
    shutil.rmtree(patched.parent, ignore_errors=True)
