"""bench quant (the quantisation check): the agreement maths on crafted inputs, variant parsing, and a smoke run on the embedded model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from fastscore.errors import DataError, UnknownQuantError
from fastscore.study.quantcheck.stats import (
    agreement,
    average_ranks,
    binned_sign_agreement,
    kl_rows,
    mean_abs_diff,
    mean_shift,
    pearson,
    sign_agreement,
    sign_of_mean_statement,
    spearman,
)
from fastscore.study.analysis.stats import resample_indices

G_REF = [1.0, -1.0, 0.2, -3.0]
G_VAR = [0.5, 1.0, -0.1, -2.0]


def test_sign_agreement_counts_matching_signs():
    assert sign_agreement(G_REF, G_VAR) == 0.5
    assert sign_agreement([0.0, 1.0], [0.0, 2.0]) == 1.0  # zero agrees only with zero
    assert sign_agreement([0.0], [1e-9]) == 0.0


def test_binned_sign_agreement_bins_by_reference_margin():
    bins = binned_sign_agreement(G_REF, G_VAR)
    assert [(b["lo"], b["hi"], b["n"]) for b in bins] == [(0.0, 0.5, 1), (0.5, 2.0, 2), (2.0, None, 1)]
    assert [b["agreement"] for b in bins] == [0.0, 0.5, 1.0]
    assert [b["n_agree"] for b in bins] == [0, 1, 1]
    empty = binned_sign_agreement([0.1], [0.1])
    assert empty[1] == {"lo": 0.5, "hi": 2.0, "n": 0}  # no value, not NaN


def test_average_ranks_share_ties():
    assert average_ranks([3, 1, 3, 2]).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert average_ranks([5, 5, 5]).tolist() == [2.0, 2.0, 2.0]


def test_spearman_matches_hand_computed_case_with_ties():
    # ranks x = [1, 2.5, 2.5, 4], ranks y = [1, 3, 2, 4]: rho = 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10)
    rho = spearman([1, 2, 2, 4], [10, 30, 20, 40])
    print("spearman", rho, "hand", 3 / math.sqrt(10))
    assert rho == pytest.approx(3 / math.sqrt(10), abs=1e-12)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None  # undefined, reported with a reason upstream


def test_pearson_and_simple_agreements():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert mean_abs_diff([0.1, 0.5], [0.2, 0.1]) == pytest.approx(0.25)
    assert agreement([0, 1, 2], [0, 2, 2]) == pytest.approx(2 / 3)
    with pytest.raises(DataError):
        sign_agreement([1.0], [1.0, 2.0])


def test_kl_of_identical_rows_is_zero_and_crafted_pair_matches_hand_value():
    logits = np.random.default_rng(0).normal(size=(3, 50))
    rows = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    assert np.all(kl_rows(rows, rows) == 0.0)
    p, q = np.log([[0.5, 0.5]]), np.log([[0.25, 0.75]])
    hand = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.143841...
    got = kl_rows(p, q)[0]
    print("kl", got, "hand", hand)
    assert got == pytest.approx(hand, abs=1e-12)
    # p_ref = 0 contributes nothing, even where the variant puts no mass either
    assert kl_rows(np.log([[1.0, 0.0]]), np.log([[1.0, 0.0]]))[0] == 0.0


def test_mean_shift_is_the_paired_mean_with_a_ci():
    idx = resample_indices(4, 500, 0)
    shift = mean_shift([0.0, 1.0, 2.0, 3.0], [0.5, 1.5, 2.5, 3.5], idx)
    assert shift["mean"] == pytest.approx(0.5)
    assert shift["lo"] == pytest.approx(0.5) and shift["hi"] == pytest.approx(0.5)


def test_sign_of_mean_statement_says_plainly_whether_it_changed():
    assert sign_of_mean_statement(-1.23, -1.19) == "sign of mean G unchanged (ref -1.230, variant -1.190)"
    changed = sign_of_mean_statement(-0.1, 0.2)
    assert "CHANGED (negative -> positive)" in changed


def test_parse_variants():
    from fastscore.study.quantcheck.run import parse_variants
    from fastscore.variants import REFERENCE
    from fastscore.variants import get as Variant

    assert parse_variants("llamacpp:q8_0, int8,q4_1,reference") == (
        Variant("llamacpp", "q8_0"), Variant("onnx", "int8"), Variant("llamacpp", "q4_1"))
    assert REFERENCE not in parse_variants("reference,f16")
    assert parse_variants("fp32") == (Variant("onnx", "fp32"),)  # the reference is always the baseline
    with pytest.raises(UnknownQuantError):
        parse_variants("q9_9")
    with pytest.raises(UnknownQuantError):
        parse_variants("llamacpp:q3_k")


@pytest.mark.slow  # a measuring tool's end-to-end run (make test-all)
def test_quant_check_smoke_on_embedded_model(tmp_path, study_data):
    """Two items, reference + the shipped q4_1 GGUF: every output is written and says whether the sign changed."""
    from fastscore.cli import main

    out = tmp_path / "quant"
    result = CliRunner().invoke(main, ["bench", "quant", "--limit", "2", "--env", "tools", "--variants",
                                       "llamacpp:q4_1", "--out", str(out), "--data", str(study_data),
                                       "--n-boot", "200", "--threads", "2"])
    print(result.output)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "quant.json").read_text())
    entry = summary["variants"]["llamacpp:q4_1"]["all"]
    assert entry["n_items"] == 2
    assert "sign of mean G" in entry["sign_of_mean"]
    assert len(summary["per_item"]) == 4  # 2 items x (reference + variant)
    print("q4_1 vs reference:", entry["sign_of_mean"], "KL/token", entry.get("kl_mean_per_action_token"))
    assert "kl_mean_per_action_token" in entry, entry.get("not_applicable")
    # The reference is the shipped q4_1 weights dequantised to fp32, so q4_1 differs only by llama.cpp's arithmetic.
    assert 0.0 <= entry["kl_mean_per_action_token"] < 1.0
    md = (out / "quant.md").read_text()
    assert "llamacpp:q4_1" in md and "sign of mean G" in md
    for plot in ("quant_scatter.png", "quant_sign_bins.png"):
        assert (out / plot).stat().st_size > 1000
    assert not list(out.glob(".kl-reference-*"))  # the scratch rows file is removed
