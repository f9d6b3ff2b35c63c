"""The default weights are batch-invariant: a token's log-prob does not depend on what shares its call.

`score`, `study` and the quant check's llama.cpp default is f32 (derived from the shipped Q4_1 file). Here one item's
requests are scored alone, with other items, in groups of any size and in micro-batches (llama.cpp's n_ubatch) of
any size, and a requests file is scored in chunks of 1 to 64 lines (`score --chunk-size`), on the real embedded model
with the default scoring settings; every per-token log-prob must agree to fastscore.variants.BATCH_INVARIANCE_TOL,
and meta.json's batch_dependent must agree with what the chunk test sees (fastscore.provenance).
Not 0: llama.cpp sums attention over KV cells in SIMD lanes, and a cell's lane depends on where the batch put it
(docs/exactness.md). The shipped Q4_1 file, whose 8-bit activation rounding depends on the batch, moves by ~0.1-1
nats here.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path

import numpy as np
import pytest

from fastscore import provenance
from fastscore.records import ScoreRequest, TokenRequest
from fastscore.registry import default_model
from fastscore.requests_io import read_requests, score_file
from fastscore.variants import default_quant
from fastscore.variants import BATCH_INVARIANCE_TOL

pytest.importorskip("llama_cpp")
from fastscore.backends.llamacpp import LlamaCppBackend  # noqa: E402
from fastscore.backends.options import LlamaCppOptions  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tool_calls.jsonl"
CHUNK_SIZES = (1, 2, 3, 8, 17, 64)
COPIES = 3  # 18 lines: 1, 2, 3 and 8 split the file differently, 17 into 17 + 1, 64 not at all


@pytest.fixture(scope="module")
def item_requests(smollm_artefact):
    """Token requests of every candidate of the example items (item id -> its requests), on the default type."""
    from fastscore.scorer import Scorer
    from fastscore.tokenizer import Tokenizer

    quant = default_quant(default_model())
    artefact = smollm_artefact("llamacpp", quant)
    backend = LlamaCppBackend(artefact.path, n_threads=2)
    scorer = Scorer(backend, Tokenizer.from_folder(artefact.tokenizer_dir),
                    chat_template_kwargs=artefact.chat_template_kwargs)
    by_item = {r.id: [scorer.prepare(ScoreRequest(r.id, r.messages, c)).token_request for c in r.candidates]
               for r in read_requests(EXAMPLES)}
    yield artefact.path, by_item
    backend.close()


def _logprobs(path: Path, requests, **options) -> list[np.ndarray]:
    with LlamaCppBackend(path, n_threads=2, options=dataclasses.replace(LlamaCppOptions(), **options)) as backend:
        return [s.logprobs for s in backend.score_tokens(requests)]


def test_the_default_type_scores_an_item_the_same_in_any_batch(item_requests):
    path, by_item = item_requests
    items = list(by_item.values())
    item, others = items[0], items[1]
    with LlamaCppBackend(path, n_threads=2) as backend:
        want = [backend.score_tokens([r])[0].logprobs for r in item]  # each request alone
        layouts = {
            "the item in one call": [s.logprobs for s in backend.score_tokens(item)],
            "with another item, reversed": [s.logprobs for s in backend.score_tokens(others + item[::-1])
                                            ][len(others):][::-1],
        }
    layouts["with another item, groups of one request"] = _logprobs(path, item + others, max_group_tokens=1)[:len(item)]
    layouts["with another item, one group"] = _logprobs(path, others + item, max_group_tokens=4096)[len(others):]
    layouts["micro-batches of 32 tokens"] = _logprobs(path, others + item, n_ubatch=32)[len(others):]
    for name, got in layouts.items():
        worst = max(float(np.abs(a - b).max()) for a, b in zip(got, want))
        print(f"\n{name}: max |d logprob| vs alone = {worst:.2e} nats/token (tolerance {BATCH_INVARIANCE_TOL:g})")
        assert worst <= BATCH_INVARIANCE_TOL, name


def test_what_moves_a_score_is_where_its_kv_cells_start_not_what_shares_its_batch(item_requests):
    """Where the batch dependence comes from. A request in one llama.cpp call with a filler request that shares
    nothing with it: a filler that sorts after it in the trie adds tokens to the micro-batch but leaves the request's
    KV cells where they were (from 0); one that sorts before it moves them by the filler's length. Bit-identical
    when the cells move by a multiple of 16 (the SIMD width of the attention sums: 16 floats with AVX-512, 8 with
    AVX2); otherwise float32 rounding moves log-probs (~1e-5 measured), within the tolerance. A long filler after
    it also widens the cells every token attends over (llama.cpp pads them to 64 with llamacpp/'s patches, 256
    without): those only add exact zeros, so they must not move the request either."""
    path, by_item = item_requests
    target = next(iter(by_item.values()))[0]
    before, after = 0, 30000  # filler token ids: the trie is sorted, so these sort before / after the request
    with LlamaCppBackend(path, n_threads=2) as backend:
        alone = backend.score_tokens([target])[0].logprobs

        def moved(token: int, length: int) -> float:
            filler = TokenRequest((token,) * length, length - 1)
            return float(np.abs(backend.score_tokens([filler, target])[1].logprobs - alone).max())

        batch_only = {n: moved(after, n) for n in (2, 17, 64, 700)}
        aligned = {n: moved(before, n) for n in (16, 32)}
        unaligned = {n: moved(before, n) for n in (2, 3, 5, 9, 17)}
    print(f"\nmax |d logprob| vs alone: more tokens in the batch {batch_only}; cells moved by 16k {aligned}; "
          f"by other offsets {unaligned} (tolerance {BATCH_INVARIANCE_TOL:g})")
    assert set(batch_only.values()) == {0.0} and set(aligned.values()) == {0.0}
    assert max(unaligned.values()) <= BATCH_INVARIANCE_TOL


@pytest.mark.skipif(platform.machine() != "x86_64", reason="tinyBLAS takes one-row f32 products on x86-64 only "
                    "(ARM NEON needs 4 rows), so elsewhere a one-row step sums in another order")
def test_a_decoding_step_gives_the_bits_of_a_prefill_of_any_width(item_requests):
    """llamacpp/0003: every f32 product runs on tinyBLAS, one-row products too, and tinyBLAS sums each output element
    in one order whatever its tile, so a context's next-token logits are the same bits whether its last token is
    the end of a prefill, a one-row step or one row of a step over all of the item's contexts (up to four). (Before
    0003 a one-row step went through ggml's per-element vec_dot and differed by ~2e-5, so greedy and sampled
    completions could depend on which requests shared a decoder call.)"""
    path, by_item = item_requests
    contexts = [list(r.tokens) for r in next(iter(by_item.values()))][:4]
    with LlamaCppBackend(path, n_threads=2) as backend:
        with backend.decoder(4) as decoder:
            prefilled = np.array(decoder.start(contexts))
        with backend.decoder(4) as decoder:
            decoder.start([c[:-1] for c in contexts])
            stepped = np.array(decoder.step(list(range(len(contexts))), [c[-1] for c in contexts]))
        with backend.decoder(4) as decoder:
            decoder.start([contexts[0][:-1]])
            alone = np.array(decoder.step([0], [contexts[0][-1]]))
    print(f"\nmax |d logit|: prefill vs a {len(contexts)}-row step {np.abs(prefilled - stepped).max():.2e}, "
          f"vs a one-row step {np.abs(prefilled[0] - alone[0]).max():.2e}")
    assert np.array_equal(prefilled, stepped) and np.array_equal(prefilled[0], alone[0])


def _many_lines(path: Path) -> Path:
    """COPIES of every example line, each copy's user turns marked so that lines share their system prompt only."""
    lines = []
    for copy in range(COPIES):
        for line in EXAMPLES.read_text().splitlines():
            record = json.loads(line)
            record["id"] = f"{record['id']}#{copy}"
            for message in record["messages"]:
                if message["role"] == "user" and copy:
                    message["content"] += f" (request {copy})"
            lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def _token_logprobs(out: Path) -> dict[tuple[str, int], np.ndarray]:
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {(r["id"], c["index"]): np.asarray(c["token_logprobs"]) for r in rows for c in r["candidates"]}


@pytest.mark.slow  # 6 passes over 18 lines of ~300-token prompts: minutes on a busy 2-core machine
@pytest.mark.parametrize("quant", ["f32", "q4_1"])
def test_chunk_sizes_1_to_64_move_scores_as_meta_json_reports(smollm_artefact, tmp_path, quant):
    """`score --chunk-size N`: the scorer's calls, and so its trie groups and KV cell offsets, change with N. The
    exact default stays within the tolerance (meta.json: batch_dependent false); the shipped q4_1 does not (true)."""
    from fastscore.selection import ModelSelection

    requests = _many_lines(tmp_path / "requests.jsonl")
    scores = {}
    with ModelSelection.resolve(default_model(), "llamacpp", quant, threads=2).open() as scorer:
        for size in CHUNK_SIZES:
            out = tmp_path / f"chunk-{size}.jsonl"
            score_file(scorer, requests, out, chunk_size=size, progress=False)
            scores[size] = _token_logprobs(out)
    first = scores[CHUNK_SIZES[0]]
    diffs = {size: max(float(np.abs(got[key] - first[key]).max()) for key in first)
             for size, got in scores.items() if size != CHUNK_SIZES[0]}
    worst = max(diffs.values())
    meta = provenance.batch_invariance("llamacpp", quant)
    print(f"\nllamacpp {quant}, {sum(len(v) for v in first.values())} tokens: max |d logprob| vs --chunk-size 1: "
          + ", ".join(f"{size}: {d:.2e}" for size, d in diffs.items())
          + f"; worst {worst:.2e} (meta.json: measured {meta['batch_max_abs_diff_measured']}, "
            f"tolerance {BATCH_INVARIANCE_TOL:g}, batch_dependent {meta['batch_dependent']})")
    assert meta["batch_dependent"] == (worst > BATCH_INVARIANCE_TOL)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="tinyBLAS takes one-row f32 products on x86-64 only")
@pytest.mark.parametrize("threads", [1, 2])
def test_a_short_stream_beside_a_long_one_gets_the_bits_it_gets_alone(item_requests, threads):
    """llamacpp/0005: in a step over KV streams each stream's attention stops at its own last cell (rounded up to
    64), not the longest stream's. A short context stepped beside a long one, and the long one beside the short,
    must give the bits each gives stepped alone, where the cells attended are only its own: a cut that dropped a
    cell the token attends to, or summed in another order, would move them. On 1 thread every product runs in turn,
    on 2 each thread takes whole products (llamacpp/0003)."""
    path, by_item = item_requests
    longest = max((list(r.tokens) for reqs in by_item.values() for r in reqs), key=len)
    short = longest[:40]
    assert len(longest) > len(short) + 2 * 64, "the long context must span cells the short one's cut leaves out"
    contexts = [short, longest, short[:-9]]
    with LlamaCppBackend(path, n_threads=threads) as backend:
        with backend.decoder(len(contexts)) as decoder:
            decoder.start([c[:-1] for c in contexts])
            together = np.array(decoder.step(list(range(len(contexts))), [c[-1] for c in contexts]))
        alone = []
        for context in contexts:
            with backend.decoder(1) as decoder:
                decoder.start([context[:-1]])
                alone.append(np.array(decoder.step([0], [context[-1]]))[0])
    worst = max(float(np.abs(together[k] - alone[k]).max()) for k in range(len(contexts)))
    print(f"\n{threads} thread(s), contexts of {[len(c) for c in contexts]} tokens: max |d logit| stepped "
          f"together vs alone {worst:.2e}")
    assert all(np.array_equal(together[k], alone[k]) for k in range(len(contexts)))
