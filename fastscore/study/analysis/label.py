"""Label contrasts: the effect of the word "failed", separated from copying the action a record shows.

Every record condition but `description` shows the failed action verbatim; they differ in what they say about it
(after: it failed; success: it succeeded; neutral: nothing; dont_repeat: it failed, do not repeat it). For each
record and each of three actions — the shown (failed) action, the correct action, an alternative (the other wrong
candidates, never shown) — we take the log-probability (natural log; per call = summed over the action's tokens, per
token = divided by its token count):

- lift(record, action) = lp(action | record) - lp(action | before). Positive: the record makes the action more
  likely. lift of the shown action is -G (G, the corrective gain, has the opposite sign).
- copying: lift(neutral, shown) — the record shows the action and says nothing about its outcome, so what it adds is
  what showing the string adds.
- differential copy (record) = lift(record, shown) - lift(record, correct) = -(the old ΔG = G(failed) - G(correct)):
  how much more the shown string gains than the correct one. It is the same under every record that shows the action,
  so it is copying, not a label effect.
- label effect (a vs b) = lp(action | a) - lp(action | b), a and b showing the *same* action with different labels.
  `after - success` is the only contrast that isolates the failure label: **failure-specific**. Positive: a failure
  record makes the action more likely than the same action shown as a success.

Every contrast is paired per item (the same resamples serve every condition) and carries n, the minimal detectable
effect at that n and the n needed for the observed effect (fastscore.study.analysis.power).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fastscore.study.data.conditions import REFERENCE
from fastscore.study.analysis.power import MIN_ITEMS, SATURATED, power_fields, saturation
from fastscore.study.analysis.stats import bootstrap_ci, present_count

if TYPE_CHECKING:  # the table type is only annotated here
    from fastscore.study.analysis.table import EnvTable

SHOWING_RECORDS = ("after", "success", "neutral", "description", "dont_repeat")
ACTIONS = ("shown", "correct", "alternative")
COPY_RECORD = "neutral"
# (a, b): lp(action | a) - lp(action | b). The first isolates the failure label (failure-specific).
FAILURE_SPECIFIC = ("after", "success")
LABEL_CONTRASTS = (FAILURE_SPECIFIC, ("after", "neutral"), ("success", "neutral"), ("dont_repeat", "after"),
                   ("neutral", "description"))  # the last: a record that shows the action vs one that describes it
REPEAT_METRICS = ("p_repeat", "p_sample_repeat", "greedy_repeat_semantic", "greedy_repeat",
                  "sampled_repeat_semantic_rate")
SCALES = ("per_call", "per_token")
# Shares and probabilities over a small set that sit at 0 or 1 on every item measure nothing at this n (saturated).
# Not exp(lp): an exact probability of 1e-12 is a value, not a bound reached.
SATURABLE = ("p_repeat", "p_repeat_norm", "greedy_repeat", "greedy_repeat_program", "greedy_repeat_semantic",
             "greedy_success", "sampled_repeat_rate", "sampled_repeat_semantic_rate")


def contrast_key(a: str, b: str) -> str:
    return f"{a}-{b}"


def action_lp(table: "EnvTable", cond: str, action: str, scale: str) -> np.ndarray:
    """Per item, the action's log-prob under `cond`: summed (per_call) or per token (NaN where absent)."""
    if action == "shown":
        lp, n = table.column(cond, "lp"), table.column(cond, "n_tokens")
    elif action == "correct":
        lp, n = table.column(cond, "correct_lp"), table.column(cond, "correct_n")
    elif action == "alternative":
        return table.column(cond, "alt_lp" if scale == "per_call" else "alt_lp_per_token")
    else:
        raise ValueError(f"unknown action {action!r} (expected one of {ACTIONS})")
    return lp if scale == "per_call" else lp / n


def lift(table: "EnvTable", cond: str, action: str, scale: str) -> np.ndarray:
    """lp(action | cond) - lp(action | before), per item."""
    return action_lp(table, cond, action, scale) - action_lp(table, REFERENCE, action, scale)


def label_effect(table: "EnvTable", a: str, b: str, action: str, scale: str) -> np.ndarray:
    """lp(action | a) - lp(action | b), per item: two records showing the same action with different labels."""
    return action_lp(table, a, action, scale) - action_lp(table, b, action, scale)


def paired_estimate(diff: np.ndarray, idx: np.ndarray) -> dict[str, Any] | None:
    """Mean [bootstrap CI] of per-item differences with n, MDE and n needed; None when no item has one."""
    if present_count(diff) == 0:
        return None
    return {**bootstrap_ci(diff, idx).to_dict(), **power_fields(diff)}


def _scaled(make, idx: np.ndarray) -> dict[str, Any]:
    out = {scale: est for scale in SCALES if (est := paired_estimate(make(scale), idx)) is not None}
    return out


def label_contrasts(table: "EnvTable", idx: np.ndarray) -> dict[str, Any]:
    """The summary's `label` entry for one table (see the module docstring for every name)."""
    if not table.has(REFERENCE):
        return {"not_applicable": f"no item has {REFERENCE!r}"}
    records = [c for c in SHOWING_RECORDS if table.has(c)]
    out: dict[str, Any] = {
        "lift": {c: {a: s for a in ACTIONS if (s := _scaled(lambda sc, c=c, a=a: lift(table, c, a, sc), idx))}
                 for c in records},
        "differential_copy": {c: s for c in records if c != "description" and (s := _scaled(
            lambda sc, c=c: lift(table, c, "shown", sc) - lift(table, c, "correct", sc), idx))},
        "label_effect": {},
        "repeat_difference": {},
    }
    for a, b in LABEL_CONTRASTS:
        if not (table.has(a) and table.has(b)):
            continue
        key = contrast_key(a, b)
        out["label_effect"][key] = {act: s for act in ACTIONS
                                    if (s := _scaled(lambda sc, act=act: label_effect(table, a, b, act, sc), idx))}
        repeats = {}
        for metric in REPEAT_METRICS:
            diff = table.column(a, metric) - table.column(b, metric)
            est = paired_estimate(diff, idx)
            if est is not None:
                both = {saturation(table.column(a, metric)), saturation(table.column(b, metric))}
                # Both records at the same bound on every item: the difference measures nothing.
                if metric in SATURABLE and len(both) == 1 and None not in both:
                    est["saturated"] = f"{SATURATED} (both records at the {both.pop()} bound on every item)"
                repeats[metric] = est
        out["repeat_difference"][key] = repeats
    return out


def label_headline(table: "EnvTable", idx: np.ndarray) -> dict[str, Any]:
    """The failure-specific contrast and copying of the shown action, for the per-kind and pooled breakdowns."""
    out: dict[str, Any] = {}
    if not table.has(REFERENCE):
        return out
    a, b = FAILURE_SPECIFIC
    if table.has(a) and table.has(b):
        out[contrast_key(a, b)] = _scaled(lambda sc: label_effect(table, a, b, "shown", sc), idx)
    if table.has(COPY_RECORD):
        out[f"copying_{COPY_RECORD}"] = _scaled(lambda sc: lift(table, COPY_RECORD, "shown", sc), idx)
    return out


def saturation_flags(table: "EnvTable", cond: str, names: tuple[str, ...]) -> dict[str, str]:
    """{metric: "upper"/"lower"} for the 0-1 metrics of `cond` at a bound on every item."""
    return {name: flag for name in names if (flag := saturation(table.column(cond, name))) is not None}


CLEAN_RETRY = "clean_retry"
CLEAN_RETRY_RIVALS = ("after", "description", "dont_repeat")
BY_CONSTRUCTION = ("by construction: the clean retry's context is `before`'s, so a temperature-1 sample repeats the "
                   "failed action with probability exp(lp(before)); the k sampled retries only estimate it")


def clean_retry_contrasts(table: "EnvTable", idx: np.ndarray) -> dict[str, Any]:
    """Clean retry against the harnesses that keep a record, on P(one T=1 sample = the failed action) = exp(lp):
    paired per item, exp(lp(before)) - exp(lp(rival)) (positive: clean retry repeats more); and on the measured share
    of samples repeating it in meaning (`semantic_minus`). Only where clean retry is measured (the model's own
    failures); a ranking is stated only when the CI excludes 0 (`ranking`)."""
    if not table.has(CLEAN_RETRY):
        return {}
    clean = table.column(REFERENCE, "p_sample_repeat")
    return {"p_sample_repeat": {**bootstrap_ci(clean, idx).to_dict(), "note": BY_CONSTRUCTION},
            "minus": _against_rivals(table, idx, REFERENCE, "p_sample_repeat", "repeats"),
            # Measured like every other record: the share of k samples repeating the failed action in meaning,
            # paired per item (the samples of each record come from its own context).
            "semantic_minus": _against_rivals(table, idx, CLEAN_RETRY, "sampled_repeat_semantic_rate",
                                              "repeats in meaning")}


def _against_rivals(table: "EnvTable", idx: np.ndarray, clean_condition: str, metric: str, verb: str
                    ) -> dict[str, Any]:
    """{rival: clean retry's `metric` (read under `clean_condition`) minus the rival's, paired, with its ranking}."""
    clean = table.column(clean_condition, metric)
    out: dict[str, Any] = {}
    for rival in CLEAN_RETRY_RIVALS:
        est = paired_estimate(clean - table.column(rival, metric), idx)  # None where the rival has no rows
        if est is not None:
            est["ranking"] = tie_verdict(est, f"clean retry {verb} more than {rival}",
                                         f"clean retry {verb} less than {rival}")
            out[rival] = est
    return out


def tie_verdict(est: dict[str, Any], above: str, below: str) -> str:
    """`above` / `below` when the CI lies wholly above / below 0 over at least MIN_ITEMS items, else why not."""
    if est.get("n", 0) < MIN_ITEMS:
        return f"not resolved: fewer than {MIN_ITEMS} items"
    lo, hi = est.get("lo"), est.get("hi")
    if lo is not None and lo > 0:
        return above
    if hi is not None and hi < 0:
        return below
    return "not resolved: the 95% CI includes a tie"


def as_cut_contrasts(table: "EnvTable", idx: np.ndarray) -> dict[str, Any]:
    """G(after) and the failure-specific contrast of the failed action scored up to the harness's cut (the
    end-of-turn token the model never emitted dropped under every condition), next to the items it changes.
    Empty for seeded failures (no attempt was cut)."""
    if not (table.has(REFERENCE) and table.has("after")):
        return {}
    cut = table.column(REFERENCE, "cut_before_end_of_turn")
    if present_count(cut) == 0 or np.nansum(cut) == 0:
        return {}
    lp, n = (lambda c: table.column(c, "lp_as_cut")), (lambda c: table.column(c, "n_as_cut"))
    out: dict[str, Any] = {"n_cut_before_end_of_turn": int(np.nansum(cut)), "n_items": present_count(cut)}
    gain = lp(REFERENCE) - lp("after")
    out["gain_after"] = paired_estimate(gain, idx)
    out["gain_after_per_token"] = paired_estimate(gain / n("after"), idx)
    a, b = FAILURE_SPECIFIC
    if table.has(b):
        for scale in SCALES:
            diff = lp(a) - lp(b) if scale == "per_call" else (lp(a) - lp(b)) / n(a)
            if (est := paired_estimate(diff, idx)) is not None:
                out[f"{contrast_key(a, b)}_{scale}"] = est
    return {k: v for k, v in out.items() if v is not None}
