"""The f32 default computed from its compact file (llamacpp/0004, fastscore.backends.llamacpp_compact).

The embedded model's f32 GGUF is its shipped Q4_1 file dequantized, so the shipped blocks hold the same f32 weights;
on a build that decodes them inside each product with f32 activations, every score and decoding step must come out
with the f32 file's bits. A compact file that does not hold the same weights, an unpatched build or the option off
run the f32 file.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from fastscore.backends.llamacpp_compact import build_decodes_weights
from fastscore.registry import default_model
from fastscore.variants import default_quant

from tests.test_exact_default import item_requests  # noqa: F401 (a fixture)

llama_cpp = pytest.importorskip("llama_cpp")
from fastscore.backends.llamacpp import LlamaCppBackend  # noqa: E402
from fastscore.backends.options import LlamaCppOptions  # noqa: E402

DECODES = build_decodes_weights(llama_cpp.__version__)
needs_decoding_build = pytest.mark.skipif(not DECODES, reason=f"llama-cpp-python {llama_cpp.__version__} does not "
                                          "decode compact weights (make install builds 0.3.36+fastscore4 or later)")


@pytest.mark.parametrize(("version", "machine", "decodes"), [
    ("0.3.36+fastscore4", "x86_64", True),
    ("0.3.36+fastscore12", "x86_64", True),
    ("0.3.36+fastscore3", "x86_64", False),
    ("0.3.36", "x86_64", False),
    ("0.3.36+fastscore4", "aarch64", False),
])
def test_which_builds_decode_compact_weights(version, machine, decodes):
    assert build_decodes_weights(version, machine) is decodes


@pytest.fixture(scope="module")
def f32_artefact(smollm_artefact):
    artefact = smollm_artefact("llamacpp", default_quant(default_model()))
    assert artefact.compact_path is not None and artefact.compact_path.name.endswith(".Q4_1.gguf")
    return artefact


def _scores_and_steps(backend, requests) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every example candidate's token log-probs in one shared call, and the logits of a prefill of four contexts,
    a four-row step and a one-row step."""
    scores = [s.logprobs for s in backend.score_tokens(requests)]
    contexts = [list(r.tokens) for r in requests[:4]]
    with backend.decoder(4) as decoder:
        first = np.array(decoder.start([c[:-1] for c in contexts]))
        wide = np.array(decoder.step(list(range(4)), [c[-1] for c in contexts]))
        one = np.array(decoder.step([2], [int(np.argmax(wide[2]))]))
    return scores, [first, wide, one]


@pytest.fixture(scope="module")
def f32_results(f32_artefact, item_requests):
    """The f32 file's scores and decoding steps (2 threads), and the requests they were computed for: every
    candidate of the example items (test_exact_default's fixture)."""
    path, by_item = item_requests
    assert path == f32_artefact.path
    requests = [r for item in by_item.values() for r in item]
    with LlamaCppBackend(f32_artefact.path, n_threads=2,
                         options=LlamaCppOptions(compact_weights=False)) as backend:
        assert backend.weights_file == f32_artefact.path
        return requests, _scores_and_steps(backend, requests)


def _max_diffs(want, got) -> tuple[float, list[float]]:
    return (max(float(np.abs(a - b).max()) for a, b in zip(want[0], got[0])),
            [float(np.abs(a - b).max()) for a, b in zip(want[1], got[1])])


@needs_decoding_build
@pytest.mark.parametrize(("threads", "n_ubatch"), [(2, 512), (1, 512), (2, 32)])
def test_the_compact_file_scores_and_decodes_with_the_f32_bits(f32_artefact, f32_results, threads, n_ubatch):
    """On 1 or 2 threads and in micro-batches of 512 or 32 tokens (products of other widths and panel splits)."""
    requests, want = f32_results
    options = dataclasses.replace(LlamaCppOptions(), n_ubatch=n_ubatch)
    with LlamaCppBackend(f32_artefact.path, n_threads=threads, options=options,
                         compact=f32_artefact.compact_path) as backend:
        assert backend.weights_file == f32_artefact.compact_path
        assert backend.describe().endswith("blocks decoded to f32, f32 activations")
        got = _scores_and_steps(backend, requests)
    score_diff, step_diff = _max_diffs(want, got)
    print(f"\n{threads} threads, n_ubatch {n_ubatch}: max |d log-prob| over {len(requests)} candidates "
          f"{score_diff:.2e}; max |d logit| prefill, 4-row step, 1-row step {step_diff}")
    assert all(np.array_equal(a, b) for a, b in zip(want[0], got[0]))
    assert all(np.array_equal(a, b) for a, b in zip(want[1], got[1]))


@needs_decoding_build
def test_without_f32_activations_the_same_file_is_the_quantised_model(f32_artefact, f32_results):
    """The control: the shipped file loaded as itself (the q4_1 variant, no override) rounds its activations to 8
    bits, so the equality above is the override's doing, and nothing marks the quantised variants."""
    requests, want = f32_results
    with LlamaCppBackend(f32_artefact.compact_path, n_threads=2) as backend:
        assert "decoded" not in backend.describe()
        got = _scores_and_steps(backend, requests)
    score_diff, step_diff = _max_diffs(want, got)
    print(f"\nshipped Q4_1 as itself: max |d log-prob| {score_diff:.3f}, max |d logit| {step_diff}")
    assert score_diff > 1e-3 and min(step_diff) > 1e-3


@needs_decoding_build
def test_the_product_opens_the_f32_default_on_its_compact_file(f32_artefact):
    from fastscore.selection import ModelSelection

    selection = ModelSelection.resolve(default_model(), "llamacpp", default_quant(default_model()), threads=1)
    with selection.open() as scorer:
        assert scorer.backend.weights_file == f32_artefact.compact_path


def test_a_rebuilt_library_or_a_touched_file_is_checked_again(tmp_path):
    """The cached verdict belongs to one build (its libraries' files) and one pair of files as they are."""
    import os
    import types

    from fastscore.backends.llamacpp_compact import _check_key

    (tmp_path / "lib").mkdir()
    library, f32, compact = tmp_path / "lib" / "libllama.so", tmp_path / "a.gguf", tmp_path / "b.gguf"
    for path in (library, f32, compact):
        path.write_bytes(b"x")
    module = types.SimpleNamespace(__version__="0.3.36+fastscore4", __file__=str(tmp_path / "__init__.py"))
    key = _check_key(module, f32, compact)
    assert _check_key(module, f32, compact) == key
    library.write_bytes(b"xy")
    assert _check_key(module, f32, compact) != key
    key = _check_key(module, f32, compact)
    os.utime(compact, ns=(1, 1))
    assert _check_key(module, f32, compact) != key


@needs_decoding_build
def test_a_compact_file_of_other_weights_is_not_used(f32_artefact, smollm_artefact, caplog):
    """The q8_0 variant is quantized again from f32, so its blocks hold other weights: the check finds its logits
    differ and the backend computes from the f32 file."""
    other = smollm_artefact("llamacpp", "q8_0").path
    with caplog.at_level(logging.WARNING, logger="fastscore.backends.llamacpp_compact"):
        with LlamaCppBackend(f32_artefact.path, n_threads=2, compact=other) as backend:
            assert backend.weights_file == f32_artefact.path
    assert any("differ" in r.getMessage() for r in caplog.records)


def test_an_unpatched_build_or_the_option_off_runs_the_f32_file(f32_artefact, monkeypatch):
    with LlamaCppBackend(f32_artefact.path, n_threads=1, compact=f32_artefact.compact_path,
                         options=dataclasses.replace(LlamaCppOptions(), compact_weights=False)) as backend:
        assert backend.weights_file == f32_artefact.path
    monkeypatch.setattr(llama_cpp, "__version__", "0.3.36")
    with LlamaCppBackend(f32_artefact.path, n_threads=1, compact=f32_artefact.compact_path) as backend:
        assert backend.weights_file == f32_artefact.path and "decoded" not in backend.describe()
