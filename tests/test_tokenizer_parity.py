"""The tokenizer rebuilt from the GGUF gives exactly llama.cpp's ids, special tokens included."""

from __future__ import annotations

import json

import pytest

from fastscore.conversion.gguf_tokenizer import load_tokenizer, read_vocab
from fastscore.embedded import embedded_gguf
from fastscore.registry import default_model, get

TEXTS = (
    "12345 3.14159",
    "a  b   \n\n\t c",
    "emoji 😀🎉👍🏽 and a flag 🇫🇷",
    "café naïve Ünïcödé façade — 日本語のテキスト 中文 한국어 Ελληνικά",
    "def square(x):\n    return x ** 2  # 100% sure\n\nprint(square(12))\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n",
    "  leading and trailing   ",
    "don't I'll WE'RE it's",
    "٣٤٥ ²³ Ⅻ ½",
    "\n\n\n",
    "",
)


@pytest.fixture(scope="module")
def llama_tokenize():
    """llama.cpp's own tokenizer on the shipped GGUF (vocab only): parse specials, add none."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = embedded_gguf(get(default_model()))
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp could not load {path}"
    vocab = llama_cpp.llama_model_get_vocab(model)

    def tokenize(text: str) -> list[int]:
        data = text.encode()
        buffer = (llama_cpp.llama_token * (len(data) + 16))()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, len(buffer), False, True)
        assert n >= 0
        return list(buffer[:n])

    yield tokenize
    llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_rebuilt_tokenizer_matches_llama_cpp(text, smollm_tokenizer_dir, llama_tokenize):
    ours = load_tokenizer(smollm_tokenizer_dir).encode(text, add_special_tokens=False).ids
    theirs = llama_tokenize(text)
    print(f"{text!r}: {len(ours)} tokens, equal={ours == theirs}")
    assert ours == theirs


def test_chat_special_tokens_are_single_ids(smollm_tokenizer_dir):
    tokenizer = load_tokenizer(smollm_tokenizer_dir)
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False).ids
    assert ids[0] == tokenizer.token_to_id("<|im_start|>") == 1
    assert tokenizer.token_to_id("<|im_end|>") == 2 and 2 in ids


def test_tokenizer_config_follows_the_gguf(smollm_tokenizer_dir):
    vocab = read_vocab(embedded_gguf(get(default_model())))
    config = json.loads((smollm_tokenizer_dir / "tokenizer_config.json").read_text())
    assert vocab.model == "gpt2" and vocab.pre == "smollm" and not vocab.add_bos
    assert config["bos_token"] is None and config["add_bos_token"] is False
    assert config["eos_token"] == "<|im_end|>" == vocab.tokens[vocab.eos_id]
    assert config["chat_template"] == vocab.chat_template
    assert config["model_max_length"] == vocab.context_length == 8192
    special = json.loads((smollm_tokenizer_dir / "special_tokens_map.json").read_text())
    assert special["eos_token"] == "<|im_end|>"


def test_transformers_renders_the_chat_template_without_bos(smollm_tokenizer_dir):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm_tokenizer_dir))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert tokenizer("hi").input_ids == load_tokenizer(smollm_tokenizer_dir).encode("hi").ids
