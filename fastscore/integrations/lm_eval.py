"""lm-evaluation-harness (0.4.x) model "fastscore": log-likelihoods from fastscore's prefix-sharing engine.

    fastscore-lm-eval --model fastscore --model_args backend=llamacpp,quant=f32 --tasks arc_easy
    python -m fastscore.integrations.lm_eval --model fastscore ...   # the same
    import fastscore.integrations.lm_eval; lm_eval.simple_evaluate(model="fastscore", ...)   # Python

lm-eval 0.4 finds models only in its own registry (no entry-point discovery), so the model is registered when this
module is imported; `fastscore-lm-eval` is lm-eval's own command line run after that import.

Semantics are lm-eval's HFLM's, so accuracies and log-likelihoods match `--model hf` on the same weights:
- text is tokenized by the model's tokenizer with special-token text parsed as specials; a BOS is prepended when the
  tokenizer adds one (HF `add_special_tokens=True`) unless the text already starts with it;
- `loglikelihood` takes lm-eval's own context/continuation split (TemplateLM._encode_pair: the context's trailing
  whitespace moves to the continuation, the continuation's tokens are those of context+continuation after the
  context's); an empty context is conditioned on the prefix token (BOS, else EOS);
- a sequence longer than `max_length` + 1 tokens loses tokens on the left, as in HFLM;
- `loglikelihood_rolling` uses lm-eval's disjoint rolling windows of `max_length`;
- `generate_until` decodes greedily and cuts the text at the first stop string (the EOS text is one).

Unlike HFLM, every request of a call goes to the backend at once, so one prefix trie shares the contexts of all
choices of all documents. `max_length` is the backend's context minus one (every scored sequence must fit it).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastscore.deps import require
from fastscore.errors import BackendError, RequestError, UnsupportedError

require("lm_eval", "lmeval", "lm-eval")

from lm_eval import utils as lm_utils  # noqa: E402  (after the check that names the extra)
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import model_registry  # noqa: E402
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text  # noqa: E402

log = logging.getLogger(__name__)

MODEL_NAME = "fastscore"
DEFAULT_MAX_GEN_TOKS = 256  # HFLM's


class FastscoreLM(TemplateLM):
    """lm-eval's LM interface on a fastscore backend. Model args: model (default: the embedded model), backend,
    quant, threads, max_length, add_bos_token, max_gen_toks; any other key=value is a backend option (n_ctx=8192).
    From Python, `scorer=` takes an open fastscore Scorer instead (model, backend, quant are then unused)."""

    def __init__(self, model: str | None = None, backend: str = "llamacpp", quant: str | None = None,
                 threads: int | None = None, max_length: int | None = None, add_bos_token: bool | None = None,
                 max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, batch_size: Any = None, max_batch_size: Any = None,
                 device: Any = None, scorer=None, **backend_options: Any) -> None:
        super().__init__()
        # batch_size and device are lm-eval's for every model: the trie takes the whole request list, on the CPU.
        del batch_size, max_batch_size, device
        if scorer is None:
            from fastscore.api import load

            opened = load(None if model is None else str(model), str(backend), None if quant is None else str(quant),
                          threads=threads, include_end_of_turn=False, progress=True,
                          backend_options={k: str(v) for k, v in backend_options.items()})
            scorer = opened.scorer
            self._info = {"fastscore_model": opened.model, "fastscore_backend": opened.backend,
                          "fastscore_quant": opened.quant}
        else:
            self._info = {"fastscore_backend": scorer.backend.name}
        self._info["fastscore_weights"] = scorer.weights_note
        self.scorer = scorer
        self.tokenizer = scorer.tokenizer
        limit = scorer.backend.n_ctx - 1  # context + continuation (max_length + 1 tokens) fit the backend
        if max_length is not None and not 1 <= int(max_length) <= limit:
            raise RequestError(f"max_length must be in [1, {limit}] on this backend (its context is "
                               f"{scorer.backend.n_ctx} tokens), not {max_length}")
        self._max_length = int(max_length) if max_length is not None else limit
        self.add_bos_token = add_bos_token
        self._max_gen_toks = int(max_gen_toks)

    # --- what lm-eval asks of a model ---

    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_id
        return self.tokenizer.end_of_turn_id if eos is None else eos

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_id
        return self.eot_token_id if bos is None else bos

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name.replace("/", "__")

    def get_model_info(self) -> dict[str, Any]:
        return dict(self._info)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        from fastscore import chat

        return chat.render(self.tokenizer.require_chat_template(), chat_history,
                           add_generation_prompt=add_generation_prompt,
                           special_tokens=self.tokenizer.special_token_variables,
                           template_kwargs=self.scorer.chat_template_kwargs)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs: Any) -> list[int]:
        """HFLM.tok_encode: the text's ids, with the BOS the tokenizer adds (unless told, or already there)."""
        add = add_special_tokens
        if add is None:
            add = self.tokenizer.add_bos if self.add_bos_token is None else self.add_bos_token
            if string.startswith(self.tokenizer.decode([self.prefix_token_id])):
                add = False
        ids = [int(i) for i in self.tokenizer.encode(string).ids]
        if add and self.tokenizer.bos_id is not None:
            ids = [self.tokenizer.bos_id, *ids]
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    # --- scoring ---

    def _score_windows(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[tuple[float, bool]]:
        """(log-prob, greedy?) of each continuation after its context, all pairs in one backend call (one trie)."""
        from fastscore.records import TokenRequest

        requests = []
        for context, continuation in pairs:
            if not context or not continuation:
                raise RequestError("lm-eval gave an empty context or continuation (token ids)")
            # HFLM keeps the last max_length + 1 tokens and feeds all but the last one.
            tokens = (list(context) + list(continuation))[-(self.max_length + 1):]
            requests.append(TokenRequest(tuple(tokens), len(tokens) - len(continuation)))
        if not requests:
            return []
        scores = self.scorer.backend.score_tokens(requests)
        out = []
        for request, score in zip(requests, scores, strict=True):
            logprobs = np.asarray(score.logprobs, dtype=np.float64)
            if logprobs.shape != (request.n_scored,) or not np.all(np.isfinite(logprobs)):
                raise BackendError(f"the {self.scorer.backend.name} backend returned invalid log-probs "
                                   f"(shape {logprobs.shape}, finite: {bool(np.all(np.isfinite(logprobs)))})")
            out.append((float(logprobs.sum()), bool(np.all(score.is_argmax))))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        answers = self._score_windows([(context, continuation) for _, context, continuation in requests])
        for (key, _, _), answer in zip(requests, answers, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The text's log-likelihood from its first token on, over HFLM's disjoint windows of max_length."""
        windows, owners = [], []
        for index, (string,) in enumerate(request.args for request in requests):
            tokens = self.tok_encode(string)
            for window in lm_utils.get_rolling_token_windows(token_list=tokens, prefix_token=self.prefix_token_id,
                                                             max_seq_len=self.max_length, context_len=1):
                windows.append(lm_utils.make_disjoint_window(window))
                owners.append(index)
        totals = [0.0] * len(requests)
        for index, (logprob, _) in zip(owners, self._score_windows(windows), strict=True):
            totals[index] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # --- generation ---

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy completions, all requests decoded together; each stops at a stop token, its first stop string
        (one more token is decoded, then the text is cut there) or max_gen_toks."""
        from fastscore.decode import greedy_decode

        if not requests:
            return []
        eos_text = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        contexts, budgets, stops = [], [], []
        for context, gen_kwargs in (request.args for request in requests):
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            if kwargs.get("do_sample") or kwargs.get("temperature", 0.0) > 0:
                raise UnsupportedError("the fastscore lm-eval model decodes greedily only (do_sample=False, "
                                       "temperature=0)")
            until = handle_stop_sequences(kwargs.get("until"), eos=eos_text)
            budget = int(kwargs["max_gen_toks"])
            if budget >= self.max_length:
                raise RequestError(f"max_gen_toks={budget} leaves no room for a context in max_length="
                                   f"{self.max_length}")
            # An empty context starts from the prefix token, as an empty loglikelihood context does.
            contexts.append(self.tok_encode(context, left_truncate_len=self.max_length - budget)
                            or [self.prefix_token_id])
            budgets.append(budget)
            stops.append([term for term in until if term])
        decoded = greedy_decode(self.scorer.backend.decoder(max(budgets)), contexts,
                                token_bytes=self.tokenizer.token_bytes, stop_ids=self.tokenizer.stop_ids,
                                max_new_tokens=budgets, action_done=[_stop_rule(terms) for terms in stops])
        out = []
        for request, terms, completion in zip(requests, stops, decoded, strict=True):
            text = postprocess_generated_text(self.tok_decode(completion.token_ids), terms, None)
            self.cache_hook.add_partial("generate_until", request.args, text)
            out.append(text)
        return out


def _stop_rule(terms: Sequence[str]):
    """Decoding may end once the text holds a stop string: nothing after it survives the cut."""
    if not terms:
        return None
    return lambda text: any(term in text for term in terms)


def main(argv: Sequence[str] | None = None) -> None:
    """`fastscore-lm-eval ...`: lm-eval's own command line, with the "fastscore" model registered."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = ["lm-eval", *argv]
    cli_evaluate()


# Registered by its import path, not as this class object: under `python -m` this file also runs as __main__,
# and a second class under the same name would collide; lm-eval imports the path when the model is asked for.
model_registry.register(MODEL_NAME, target="fastscore.integrations.lm_eval:FastscoreLM")

if __name__ == "__main__":
    main()
