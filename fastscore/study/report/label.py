"""Report sections for the label contrasts (fastscore.study.analysis.label): the effect of the failure label, copying,
repeats under every record, clean retry — each with n, its CI and what this n can detect."""

from __future__ import annotations

from typing import Any

from fastscore.study.analysis.label import (
    ACTIONS, COPY_RECORD, FAILURE_SPECIFIC, REPEAT_METRICS, SHOWING_RECORDS, contrast_key, tie_verdict,
)
from fastscore.study.report.markdown import cell, num, table

CONTRAST_NAMES = {
    "after-success": "failure-specific: after - success",
    "after-neutral": "failure label vs no label: after - neutral",
    "success-neutral": "success label vs no label: success - neutral",
    "dont_repeat-after": "instruction: dont_repeat - after",
    "neutral-description": "showing the action: neutral - description",
}
REPEAT_NAMES = {"p_repeat": "P(repeat) over the candidate set",
                "p_sample_repeat": "P(T=1 sample = shown action) = exp(lp)",
                "greedy_repeat_semantic": "greedy repeat, semantic", "greedy_repeat": "greedy repeat, token for token",
                "sampled_repeat_semantic_rate": "sampled repeats, semantic (share of k per item)"}


def power_cell(entry: dict[str, Any] | None) -> str:
    """`mean [CI] (n); MDE x; n needed m`: what this n can resolve next to what it saw."""
    if entry is None:
        return "n/a"
    parts = [cell(entry)]
    if "mde" in entry:
        parts.append(f"MDE {num(entry['mde'])}")
    if "n_needed" in entry:
        parts.append(f"n for this effect {entry['n_needed']}")
    return "; ".join(parts)


def failure_vs_success_answer(label: dict[str, Any], where: str) -> str:
    """The sentence answering: does a failure record make the failed action more likely than the same action shown
    as a success? Yes / no only when the CI excludes 0; otherwise what this n could have detected."""
    key = contrast_key(*FAILURE_SPECIFIC)
    entry = (label.get("label_effect") or {}).get(key, {}).get("shown", {})
    call, token = entry.get("per_call"), entry.get("per_token")
    if call is None:
        return f"{where}: the data cannot answer whether a failure record makes the failed action more likely than " \
               "the same action shown as a success (no item has both the after and the success record)."
    verdict = tie_verdict(call, "**yes**: the failure record makes the failed action more likely than the same "
                                "action shown as a success",
                          "**no**: the failure record makes the failed action less likely than the same action "
                          "shown as a success")
    text = (f"{where}: lp(failed | after) - lp(failed | success) = {cell(call)} nats per call, {cell(token)} per "
            f"token — ")
    if verdict.startswith("not resolved"):
        mde = call.get("mde")
        why = "the 95% CI includes 0" if "tie" in verdict else verdict.split(": ", 1)[1]
        text += (f"the data cannot answer at this n ({why}"
                 + (f"; the smallest effect it would detect with 80% power is {num(mde)} nats per call" if mde
                    else "") + (f"; the observed effect would need n = {call['n_needed']}" if "n_needed" in call
                                else "") + ").")
    else:
        text += verdict + " (the 95% CI excludes 0)."
    return text


def label_section(summary: dict[str, Any]) -> str:
    """### Label contrasts for one environment's summary."""
    label = summary.get("label") or {}
    if "not_applicable" in label or not label:
        return "### Label contrasts\n\nNot applicable: " + str(label.get("not_applicable", "no label entry")) + "."
    intro = ("lp = log-probability (nats) of an action; **positive = more likely**. lift(record) = lp(action | "
             "record) - lp(action | before) (for the shown action that is -G). Every record but `description` shows "
             f"the failed action verbatim; lift under `{COPY_RECORD}` (no outcome stated) is **copying**. A label "
             "effect compares two records that show the same action: `after - success` alone isolates the failure "
             "label (**failure-specific**). The differential copy lift(shown) - lift(correct) (= -ΔG) is copying "
             "of the shown string relative to the correct one, under whatever label. Alternative = the mean over the "
             "other wrong candidates, never shown. Cells: mean [95% CI] (n); MDE = the smallest true effect this n "
             "detects with 80% power at two-sided 0.05 (2.8 x the paired SE); n for this effect = the items the "
             "observed mean would need.")
    effects = []
    for key, by_action in (label.get("label_effect") or {}).items():
        for action in ACTIONS:
            entry = by_action.get(action, {})
            effects.append([CONTRAST_NAMES.get(key, key), action, power_cell(entry.get("per_call")),
                            power_cell(entry.get("per_token"))])
    lifts = []
    for record in SHOWING_RECORDS:
        by_action = (label.get("lift") or {}).get(record)
        if not by_action:
            continue
        copy = (label.get("differential_copy") or {}).get(record, {})
        lifts.append([record] + [cell(by_action.get(a, {}).get("per_token")) for a in ACTIONS]
                     + [cell(by_action.get("shown", {}).get("per_call")), power_cell(copy.get("per_token"))])
    repeats = [[CONTRAST_NAMES.get(key, key)] + [power_cell(by.get(m)) for m in REPEAT_METRICS]
               for key, by in (label.get("repeat_difference") or {}).items()]
    return "\n\n".join([
        "### Label contrasts: the failure label, separated from copying",
        intro,
        "- " + failure_vs_success_answer(label, "Failure vs success record") + as_cut_note(summary),
        table(["contrast", "action", "per call (nats)", "per token (nats)"], effects),
        "Lift per record (per token unless named):",
        table(["record", "lift: shown", "lift: correct", "lift: alternative", "lift: shown, per call",
               "differential copy / token"], lifts),
        "Repeats of the shown action, paired difference between records (share points; Wilson intervals of each "
        "record's own rate are in the conditions table):",
        table(["contrast", *(REPEAT_NAMES[m] for m in REPEAT_METRICS)], repeats),
    ])


def as_cut_note(summary: dict[str, Any]) -> str:
    """On-policy: the same numbers with the failed action scored up to the harness's cut (no unemitted end-of-turn)."""
    cut = summary.get("as_cut")
    if not cut:
        return ""
    key = contrast_key(*FAILURE_SPECIFIC)
    return (f"\n- Scored up to the harness's cut: {cut['n_cut_before_end_of_turn']} of {cut['n_items']} of the model's "
            "attempts did not end their turn after the action (the harness cut them), so the end-of-turn token scored "
            "after it was never emitted; without it, under every condition alike, G(after) / token = "
            f"{power_cell(cut.get('gain_after_per_token'))} and lp(failed | after) - lp(failed | success) = "
            f"{power_cell(cut.get(key + '_per_call'))} nats per call.")


def clean_retry_section(summary: dict[str, Any]) -> str | None:
    """Clean retry as the construction it is, and its ranking against the other harnesses only past the tie."""
    retry = summary.get("clean_retry")
    if not retry:
        return None
    rows = [[rival, power_cell(est), est.get("ranking", "")] for rival, est in retry.get("minus", {}).items()]
    semantic_rows = [[rival, power_cell(est), est.get("ranking", "")]
                     for rival, est in (retry.get("semantic_minus") or {}).items()]
    clean = summary.get("conditions", {}).get("clean_retry", {})
    sampled, semantic = clean.get("sampled_repeat_rate"), clean.get("sampled_repeat_semantic_rate")
    in_meaning = ("" if semantic is None else
                  f" Judged in meaning, as the greedy repeats are (the same call after argument normalisation; the "
                  f"same failing test outcome), {cell(semantic)} of the samples repeated the failed action; the "
                  "greedy retry repeats it by construction (it is the model's own attempt).")
    return "\n\n".join([
        "### Clean retry",
        f"P(one temperature-1 sample from the clean context = the failed action) = exp(lp(before)) = "
        f"{cell(retry['p_sample_repeat'])}, **by construction** (the clean retry's messages are `before`'s); the "
        f"sampled retries estimate it: {cell(sampled)} of the samples repeated it token for token." + in_meaning,
        table(["vs", "exp(lp(before)) - exp(lp(vs)), paired", "ranking (stated only when the CI excludes 0)"], rows),
        *([("Measured like every other record: the share of each record's k samples that repeat the failed action "
            "in meaning, clean retry's minus the rival's, paired per item:"),
           table(["vs", "samples repeating in meaning: clean retry - vs, paired",
                  "ranking (stated only when the CI excludes 0)"], semantic_rows)] if semantic_rows else []),
    ])


def kind_label_cell(h: dict[str, Any]) -> str:
    """The failure-specific contrast per token in a headline row (per kind, pooled)."""
    entry = (h.get("label") or {}).get(contrast_key(*FAILURE_SPECIFIC), {}).get("per_token")
    return cell(entry)


def env_label_headline(s: dict[str, Any]) -> dict[str, Any]:
    """An environment summary's label entry in the shape the per-kind headlines have."""
    label = s.get("label") or {}
    out: dict[str, Any] = {}
    fs = (label.get("label_effect") or {}).get(contrast_key(*FAILURE_SPECIFIC), {}).get("shown")
    if fs:
        out[contrast_key(*FAILURE_SPECIFIC)] = fs
    return out


def cut_rate_note(envs: dict[str, Any], skipped: dict[str, dict[str, int]], failure_source: str | None) -> str:
    """Per environment, the model's own attempts cut at the token cap among those examined (on-policy runs only):
    a cut attempt is skipped, so a high rate means the items are the short attempts."""
    from fastscore.mathops import wilson_interval
    from fastscore.study.stages.onpolicy import ATTEMPT_REASONS, CUT_AT_CAP

    lines = []
    for env in list(envs) + [e for e in skipped if e not in envs]:
        reasons = skipped.get(env) or {}
        attempts = sum(n for reason, n in reasons.items() if reason.startswith(ATTEMPT_REASONS))
        if not attempts and failure_source != "model":
            continue
        examined = attempts + int((envs.get(env) or {}).get("n_items", 0))
        cut = reasons.get(CUT_AT_CAP, 0)
        if not examined:
            continue
        lo, hi = wilson_interval(cut, examined)
        lines.append(f"{env}: {cut} of {examined} attempts examined were cut at the token cap "
                     f"({100 * cut / examined:.0f}%, Wilson 95% CI {100 * lo:.0f}-{100 * hi:.0f}%)")
    return "" if not lines else "\n\nCut rate of the model's own attempts: " + "; ".join(lines) + "."
