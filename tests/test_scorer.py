"""The text-level scorer: spans, end-of-turn, straddles, BOS, candidate sets, batching, typed errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scorer_helpers import CountingFakeBackend, copy_tokenizer

from fastscore.errors import ContextTooLongError, RequestError, TokenizationError
from fastscore.mathops import gather_logprobs
from fastscore.records import CandidateSet, Message, ScoreRequest
from fastscore.scorer import Scorer
from fastscore.tokenizer import Tokenizer
from fastscore.variants import BATCH_INVARIANCE_TOL

USER = (Message("user", "What is 2 + 2?"),)
CONTINUATIONS = ["4", "The answer is 4.", " leading space", "two\nlines\n", "ünïcödé ✓ 日本", 'print("hi")  ']


@pytest.mark.parametrize("continuation", CONTINUATIONS)
def test_scored_tokens_decode_to_the_continuation_and_end_of_turn(fake_scorer, continuation):
    [result] = fake_scorer.score([ScoreRequest("r", USER, continuation)])
    decoded = fake_scorer.tokenizer.decode(result.token_ids)
    print(repr(decoded))
    assert decoded == continuation + "<|im_end|>"
    assert result.token_ids[-1] == fake_scorer.tokenizer.end_of_turn_id == 2
    assert result.boundary_straddles == 0 and result.includes_end_of_turn
    assert result.n_tokens == len(result.token_logprobs) == len(result.token_is_argmax)
    assert isinstance(result.logprob, float) and np.isfinite(result.logprob)
    assert result.logprob == pytest.approx(sum(result.token_logprobs))


def test_excluding_end_of_turn_scores_the_continuation_alone(smollm_tokenizer):
    with_eot = Scorer(CountingFakeBackend(), smollm_tokenizer).score([ScoreRequest("r", USER, "The answer is 4.")])[0]
    scorer = Scorer(CountingFakeBackend(), smollm_tokenizer, include_end_of_turn=False)
    [result] = scorer.score([ScoreRequest("r", USER, "The answer is 4.")])
    assert smollm_tokenizer.decode(result.token_ids) == "The answer is 4."
    assert result.n_tokens == with_eot.n_tokens - 1 and not result.includes_end_of_turn
    assert result.token_logprobs == with_eot.token_logprobs[:-1]


def test_logprobs_match_the_model_run_on_the_whole_rendered_text(fake_scorer):
    """Ground truth outside the scorer: render, tokenize, run the fake model sequentially, pick the scored rows."""
    tok = fake_scorer.tokenizer
    text = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    text += "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\nThe answer is 4.<|im_end|>"
    ids = tok.encode(text).ids
    n_scored = len(tok.encode("The answer is 4.").ids) + 1
    logits = fake_scorer.backend.model.reference_logits(ids)
    expected, _ = gather_logprobs(logits[len(ids) - n_scored - 1 : -1], ids[-n_scored:])
    [result] = fake_scorer.score([ScoreRequest("r", USER, "The answer is 4.")])
    diff = np.abs(np.array(result.token_logprobs) - expected).max()
    print("max |scorer - sequential| =", diff)
    assert result.n_tokens == n_scored and diff <= BATCH_INVARIANCE_TOL


STRADDLE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}Ans{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\nAns{% endif %}"
)


def test_a_token_straddling_the_boundary_is_scored_and_counted(smollm_tokenizer_dir, tmp_path):
    """The template's reply starts with "Ans"; the continuation "wer: 4" completes the word: BPE makes "Answer"."""
    tok = Tokenizer.from_folder(copy_tokenizer(smollm_tokenizer_dir, tmp_path / "tok", template=STRADDLE_TEMPLATE))
    [result] = Scorer(CountingFakeBackend(), tok).score([ScoreRequest("r", USER, "wer: 4")])
    print([tok.token_text(i) for i in result.token_ids])
    assert tok.token_text(result.token_ids[0]) == "Answer"
    assert tok.decode(result.token_ids) == "Answer: 4<|im_end|>"
    assert result.boundary_straddles == 1
    [clean] = Scorer(CountingFakeBackend(), tok).score([ScoreRequest("r", USER, " wer: 4")])
    assert clean.boundary_straddles == 0 and tok.decode(clean.token_ids) == " wer: 4<|im_end|>"


def _bos_tokenizer(src, tmp_path, template, add_bos=True):
    folder = copy_tokenizer(
        src, tmp_path / "bos", template=template, config={"bos_token": "<|endoftext|>", "add_bos_token": add_bos}
    )
    return Tokenizer.from_folder(folder)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("prefix, add_bos", [("", True), ("{{ bos_token }}", True), ("{{ bos_token }}{{ bos_token }}", True),
                                             ("", False), ("{{ bos_token }}", False)])
def test_exactly_the_bos_the_model_expects(smollm_tokenizer_dir, tmp_path, prefix, add_bos):
    tok = _bos_tokenizer(smollm_tokenizer_dir, tmp_path, prefix + CHATML, add_bos)
    scorer = Scorer(CountingFakeBackend(), tok)
    prepared = scorer.prepare(ScoreRequest("r", USER, "4"))
    tokens = prepared.token_request.tokens
    n_bos = sum(1 for t in tokens[:3] if t == tok.bos_id)
    expected = 1 if add_bos or prefix else 0
    print(prefix, add_bos, tokens[:3])
    assert n_bos == expected
    assert tokens[expected] == tok._tok.token_to_id("<|im_start|>")
    assert scorer.context_ids(USER)[:expected] == [tok.bos_id] * expected
    assert tok.decode(prepared.token_request.tokens[prepared.token_request.score_from :]) == "4<|im_end|>"


def test_add_bos_is_read_from_the_post_processor_when_the_config_is_silent(smollm_tokenizer_dir, tmp_path):
    """Llama 3 style: no add_bos_token in the config, the tokenizer's post-processor prepends the BOS."""
    import json

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    folder = copy_tokenizer(smollm_tokenizer_dir, tmp_path / "tok", template=CHATML)
    backend = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    backend.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("add_bos_token")
    config["bos_token"] = "<|endoftext|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_folder(folder)
    assert tok.add_bos and tok.bos_id == 0
    assert list(tok.encode("<|im_start|>").ids) == [1]  # encoding itself never adds it; the scorer does, once
    assert Scorer(CountingFakeBackend(), tok).context_ids(USER)[:2] == [0, 1]


def test_end_of_turn_token_is_what_the_template_closes_a_reply_with(smollm_tokenizer, smollm_tokenizer_dir, tmp_path):
    assert smollm_tokenizer.end_of_turn_id == smollm_tokenizer._tok.token_to_id("<|im_end|>")
    template = CHATML.replace("<|im_end|>", "<|endoftext|>")
    tok = Tokenizer.from_folder(copy_tokenizer(smollm_tokenizer_dir, tmp_path / "tok", template=template))
    assert tok.end_of_turn_id == 0 and tok.eos_id == 2
    [result] = Scorer(CountingFakeBackend(), tok).score([ScoreRequest("r", USER, "4")])
    assert tok.decode(result.token_ids) == "4<|endoftext|>"


def test_past_assistant_turns_may_render_differently_from_the_live_one(smollm_tokenizer_dir, tmp_path):
    """Qwen3-like: thinking is stripped from past assistant turns but not from the live one."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}{{ m.content.split('</think>')[-1] }}"
        "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    )
    tok = Tokenizer.from_folder(copy_tokenizer(smollm_tokenizer_dir, tmp_path / "tok", template=template))
    messages = (Message("user", "a"), Message("assistant", "<think>hmm</think>b"), Message("user", "c"))
    continuation = "<think>ok</think>d"
    scorer = Scorer(CountingFakeBackend(), tok)
    [result] = scorer.score([ScoreRequest("r", messages, continuation)])
    assert tok.decode(result.token_ids) == continuation + "<|im_end|>"
    context = tok.decode(scorer.prepare(ScoreRequest("r", messages, continuation)).token_request.tokens)
    assert "hmm" not in context and "<think>ok" in context


def test_candidate_set_probabilities_are_a_softmax_over_the_set(fake_scorer):
    candidates = ("4", "four", "The answer is 4.", "5")
    [out] = fake_scorer.score_candidates([CandidateSet("s", USER, candidates)])
    totals = np.array([r.logprob for r in out.results])
    per_token = np.array([r.logprob / r.n_tokens for r in out.results])
    by_hand = np.exp(totals) / np.exp(totals).sum()
    by_hand_per_token = np.exp(per_token) / np.exp(per_token).sum()
    print("probs", out.probs, "by hand", by_hand)
    assert sum(out.probs) == pytest.approx(1.0) and sum(out.probs_per_token) == pytest.approx(1.0)
    np.testing.assert_allclose(out.probs, by_hand, rtol=1e-9)
    np.testing.assert_allclose(out.probs_per_token, by_hand_per_token, rtol=1e-9)
    assert [r.continuation for r in out.results] == list(candidates)


def test_many_contexts_go_to_the_backend_in_one_call_and_share_prefixes(fake_scorer):
    sets = [CandidateSet(f"s{i}", (Message("user", f"Question {i}?"),), ("yes", "no", "maybe")) for i in range(4)]
    results = fake_scorer.score_candidates(sets)
    backend = fake_scorer.backend
    print("calls", backend.calls, backend.stats)
    assert backend.calls == [12]
    assert backend.stats.computed_tokens < backend.stats.requested_tokens  # the shared system prompt once
    assert [r.id for r in results] == [s.id for s in sets]


def test_results_do_not_depend_on_what_else_is_in_the_batch(smollm_tokenizer):
    requests = [ScoreRequest(f"r{i}", (Message("user", f"Q{i}"),), c) for i in range(3) for c in ("a", "bb c")]
    together = Scorer(CountingFakeBackend(), smollm_tokenizer).score(requests)
    small_batches = Scorer(CountingFakeBackend(), smollm_tokenizer, max_batch_tokens=1)
    alone = small_batches.score(requests)
    assert small_batches.backend.calls == [1] * len(requests)
    diff = max(abs(a - b) for x, y in zip(together, alone) for a, b in zip(x.token_logprobs, y.token_logprobs))
    print("max |batched - alone| =", diff)
    assert diff < 1e-6
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


@pytest.mark.parametrize(
    "request_, error, message",
    [
        (ScoreRequest("e", USER, ""), RequestError, "empty continuation"),
        (ScoreRequest("w", (Message("wizard", "hi"),), "x"), RequestError, "unknown role 'wizard'"),
    ],
)
def test_bad_requests_raise_typed_errors_naming_the_request(fake_scorer, request_, error, message):
    with pytest.raises(error) as err:
        fake_scorer.score([ScoreRequest("ok", USER, "fine"), request_])
    print(err.value)
    assert message in str(err.value) and repr(request_.id) in str(err.value)
    assert fake_scorer.backend.calls == []  # input errors surface before any compute


def test_context_longer_than_the_backend_window_names_the_request_and_both_lengths(smollm_tokenizer):
    scorer = Scorer(CountingFakeBackend(n_ctx=64), smollm_tokenizer)
    with pytest.raises(ContextTooLongError) as err:
        scorer.score([ScoreRequest("long-one", (Message("user", "word " * 80),), "x")])
    print(err.value)
    message = str(err.value)
    assert "'long-one'" in message and "context of 64 tokens" in message
    assert int(re.search(r"is (\d+) tokens", message).group(1)) > len(scorer.tokenizer.encode("word " * 80).ids)


def test_a_template_that_raises_gives_a_request_error(smollm_tokenizer_dir, tmp_path):
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}"
    tok = Tokenizer.from_folder(copy_tokenizer(smollm_tokenizer_dir, tmp_path / "tok", template=template + CHATML))
    with pytest.raises(RequestError, match="first message must be from the user"):
        Scorer(CountingFakeBackend(), tok).score([ScoreRequest("r", (Message("system", "s"),), "x")])


def test_template_helpers_and_kwargs(smollm_tokenizer_dir, tmp_path):
    """tojson (no HTML escaping), strftime_now, {% generation %}, and chat_template_kwargs such as enable_thinking."""
    template = (
        "<|im_start|>system\n{{ strftime_now('%Y') }} {{ {'a': '<b>'} | tojson }}<|im_end|>\n"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% generation %}{{ m.content }}{% endgeneration %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    )
    tok = Tokenizer.from_folder(copy_tokenizer(smollm_tokenizer_dir, tmp_path / "tok", template=template))
    scorer = Scorer(CountingFakeBackend(), tok, chat_template_kwargs={"enable_thinking": False})
    context = tok.decode(scorer.context_ids(USER))
    print(repr(context))
    assert '{"a": "<b>"}' in context and context.endswith("<think>\n\n</think>\n\n")
    assert context.split("\n")[1][:4].isdigit()
    [result] = scorer.score([ScoreRequest("r", USER, "4")])
    assert tok.decode(result.token_ids) == "4<|im_end|>"


def test_a_template_without_the_end_of_turn_after_the_reply_is_an_error(smollm_tokenizer_dir, tmp_path):
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    tok = Tokenizer.from_folder(
        copy_tokenizer(smollm_tokenizer_dir, tmp_path / "tok", template=template)
    )
    with pytest.raises(TokenizationError, match="end-of-turn"):
        Scorer(CountingFakeBackend(), tok).score([ScoreRequest("r", USER, "4")])
    [result] = Scorer(CountingFakeBackend(), tok, include_end_of_turn=False).score([ScoreRequest("r", USER, "4")])
    assert tok.decode(result.token_ids) == "4"


def test_unset_special_tokens_render_empty_and_named_templates_load(smollm_tokenizer_dir, tmp_path):
    """SmolLM2's config has no BOS: `{{ bos_token }}` renders nothing (transformers leaves it undefined)."""
    import json

    folder = copy_tokenizer(smollm_tokenizer_dir, tmp_path / "tok")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "unused"}, {"name": "default", "template": "{{ bos_token }}" + CHATML}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_folder(folder)
    assert tok.bos_id is None and not tok.add_bos
    ids = Scorer(CountingFakeBackend(), tok).context_ids(USER)
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
