"""report.md from a summary (fastscore.study.analysis.metrics.summarize) and the run's metadata; every sentence is
computed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastscore.provenance import versions_markdown
from fastscore.study.data.conditions import (
    CLEAN_RETRY_SEEDED, CONDITIONS, GAIN_UNDEFINED, REFERENCE, REMEDIES, SAME_AS_REFERENCE,
)
from fastscore.study.analysis.metrics import POOLED
from fastscore.study.report.markdown import cell as _cell, ci_pct as _ci_pct
from fastscore.study.report.control import copy_control_section, delta_reading, kinds_section, pooled_section
from fastscore.study.report.control import pooled_line
from fastscore.study.report.markdown import num as _num
from fastscore.study.report.markdown import table as _table
from fastscore.study.report.label import clean_retry_section, cut_rate_note, failure_vs_success_answer, label_section
from fastscore.study.report.sensitivity import sensitivity_section
from fastscore.study.report.redactions import redaction_note
from fastscore.study.report.plots import PLOT_FILES, PLOT_TITLES

log = logging.getLogger(__name__)

REPORT_NAME = "report.md"
NOT_RECORDED = "not recorded"
CONDITION_COLUMNS = (
    ("gain", "G total (nats)"),
    ("gain_per_token", "G / token (nats)"),
    ("odds_factor", "odds factor exp(-G/token)"),
    ("share_negative", "share G < 0"),
    ("p_repeat", "P(repeat)"),
    ("p_repeat_norm", "P(repeat), per-token norm."),
    ("greedy_repeat", "greedy repro, token for token"),
    ("greedy_repeat_program", "greedy repro, env's match"),
    ("greedy_repeat_semantic", "greedy repeat, semantic"),
    ("greedy_success", "greedy success"),
    ("banned_mass", "banned mass"),
    ("p_sample_repeat", "P(T=1 sample = failed) = exp(lp)"),
    ("sampled_repeat_rate", "samples repeating"),
    ("sampled_repeat_semantic_rate", "samples repeating, semantic"),
)
# Cells whose value holds by construction, per failure source: (condition, column) -> why.
BY_CONSTRUCTION = {
    ("ban", "p_repeat"): "0 by construction", ("ban", "p_repeat_norm"): "0 by construction",
    ("ban", "greedy_repeat"): "0 by construction",
}
BY_CONSTRUCTION_MODEL = {
    **{(c, k): "the model's own attempt: by construction" for c in ("before", "clean_retry")
       for k in ("greedy_repeat", "greedy_repeat_program", "greedy_repeat_semantic", "greedy_success")},
    ("clean_retry", "p_repeat"): "= before's by construction", ("clean_retry", "p_repeat_norm"): "= before's",
    ("clean_retry", "p_sample_repeat"): "= before's by construction",
}
RUN_PARAMETERS = (
    ("model", "model"),
    ("backend", "backend"),
    ("quant", "quant"),
    ("seed", "seed"),
    ("limit", "item limit per env"),
    ("failure_source", "failure source"),
    ("seeded_mix", "seeded failure mix"),
    ("retries", "samples per on-policy item and record (temperature 1.0)"),
    ("end_of_turn", "end-of-turn token scored"),
    ("greedy_from", "greedy completions"),
    ("n_boot", "bootstrap resamples"),
    ("date", "date"),
    ("command", "command line"),
)


def write_report(summary: dict[str, Any], out_dir: Path, meta: dict[str, Any]) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    envs = {env: s for env, s in summary.items() if env != POOLED}
    parts = [
        "# fastscore study: the corrective gain of a failure record",
        _conventions(),
        "## Weights\n\n" + str(meta.get("weights", NOT_RECORDED)),
        *([f"**{meta['sandbox_note']}.**"] if meta.get("sandbox_note") else []),
        _run_parameters(meta),
        *([versions_markdown(meta["provenance"])] if "provenance" in meta else []),
        _stage_timings(meta.get("stage_seconds") or {}, meta.get("stage_tokens") or {}),
        _items(envs, meta.get("skipped") or {}) + redaction_note(envs, meta.get("failure_source"))
        + cut_rate_note(envs, meta.get("skipped") or {}, meta.get("failure_source")),
        *([pooled_section(summary[POOLED])] if POOLED in summary else []),
        *filter(None, [sensitivity_section(summary)]),
    ]
    marks = construction_marks(meta.get("failure_source"))
    for env, env_summary in envs.items():
        parts.append(_env_section(env, env_summary, marks))
    parts.append(_plots(out_dir))
    path = out_dir / REPORT_NAME
    path.write_text("\n\n".join(parts).rstrip() + "\n", encoding="utf-8")
    log.info("wrote %s", path)
    return path


def _conventions() -> str:
    return (
        "Corrective gain G(c) = lp(before) - lp(c): the log-probability (natural log, summed over the action's "
        "tokens) of re-emitting the action that just failed, without the failure record minus with condition c. "
        "**Positive G: the record made the failed action less likely (corrected); negative G: more likely "
        "(backfired).** G / token divides by the failed action's token count under c; the odds factor "
        "exp(-mean G/token) multiplies each token's odds (above 1: repeat more likely). Cells read "
        "`mean [95% CI] (n)`, with percentile-bootstrap CIs over items; the same resamples serve every condition "
        "of an environment, so paired quantities stay paired. Items lacking a condition are excluded pairwise and "
        "n counts the items used. ⚠ marks a ratio whose denominator's CI includes 0 (the ratio is unstable)."
    )


def _run_parameters(meta: dict[str, Any]) -> str:
    rows = []
    for key, label in RUN_PARAMETERS:
        value = meta.get(key)
        text = NOT_RECORDED if value is None else (f"`{value}`" if key == "command" else str(value))
        rows.append([label, text])
    return "## Run parameters\n\n" + _table(["parameter", "value"], rows)


def _stage_timings(stage_seconds: dict[str, float], stage_tokens: dict[str, int]) -> str:
    if not stage_seconds:
        return "## Stage timings\n\nNo stage timings were recorded."
    rows = []
    for stage, seconds in stage_seconds.items():
        tokens = stage_tokens.get(stage)
        rate = f"{tokens / seconds:.0f}" if tokens and seconds > 0 else ""
        rows.append([stage, f"{seconds:.1f}", "" if tokens is None else str(tokens), rate])
    rows.append(["**total**", f"**{sum(stage_seconds.values()):.1f}**", str(sum(stage_tokens.values()) or ""), ""])
    return ("## Stage timings\n\nTokens: what the model computed in the stage (the backend's counter of tokens fed "
            "through it, prefixes shared between requests counted once).\n\n"
            + _table(["stage", "seconds", "tokens computed", "tok/s"], rows))


def _items(summary: dict[str, Any], skipped: dict[str, dict[str, int]]) -> str:
    conds = [c for c in CONDITIONS if any(c in s.get("conditions_present", {}) for s in summary.values())]
    rows = []
    for env in list(summary) + [e for e in skipped if e not in summary]:
        present = summary.get(env, {}).get("conditions_present", {})
        n_skipped = sum((skipped.get(env) or {}).values())
        rows.append([env, str(summary.get(env, {}).get("n_items", 0)), str(n_skipped)]
                    + [str(present.get(c, 0)) for c in conds])
    text = "## Items\n\nItems scored per environment, items skipped, and items scored under each condition.\n\n"
    text += _table(["env", "items", "skipped"] + conds, rows)
    reasons = [[env, reason, str(count)] for env, by in skipped.items() for reason, count in (by or {}).items()]
    if reasons:
        text += "\n\nSkipped source records by reason:\n\n" + _table(["env", "reason", "count"], reasons)
    else:
        text += "\n\nNo source record was skipped."
    return text


def _short_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if reason.startswith("reference condition"):
        return "reference"
    if reason.startswith("not applicable"):
        return "not applicable"
    if reason.startswith("not recorded"):
        return None
    return reason


def _condition_table(conditions: dict[str, Any], marks: dict[tuple[str, str], str]) -> str:
    rows = []
    for cond, metrics in conditions.items():
        missing = metrics.get("not_applicable", {})
        cells = []
        for k, _ in CONDITION_COLUMNS:
            text = _cell(metrics.get(k), _short_reason(missing.get(k)))
            # A value fixed by construction is no finding: the cell says why instead of showing it.
            cells.append(f"not applicable ({marks[cond, k]})" if (cond, k) in marks and k in metrics else text)
        rows.append([cond] + cells)
    note = ("\n\nP(T=1 sample = failed) = exp(lp): the exact probability that one sample at temperature 1.0 from "
            "that context is the failed action token for token; `samples repeating` is the measured share of k seeded "
            "samples from that condition's context (every record and clean_retry; on-policy failures only), which "
            "estimates it, and `samples repeating, semantic` the share that repeat it in meaning. Under seeded "
            "failures nothing is sampled (those columns read n/a): the committed seeded rows define that source.")
    return _table(["condition"] + [label for _, label in CONDITION_COLUMNS], rows) + note


def _decomposition_table(dec: dict[str, Any]) -> str:
    missing = dec.get("not_applicable", {})
    spec = (
        ("gain_after", "G(after)", dec.get("items_neutral_set")),
        ("surface", "surface part: G(neutral)", dec.get("items_neutral_set")),
        ("semantic_vs_neutral", "semantic part: G(after) - G(neutral)", dec.get("items_neutral_set")),
        ("surface_share", "surface share: mean G(neutral) / mean G(after)", dec.get("items_neutral_set")),
        ("gain_after_success_set", "G(after)", dec.get("items_success_set")),
        ("semantic_vs_success", "semantic part: G(after) - G(success)", dec.get("items_success_set")),
    )
    rows = [[label, _cell(dec.get(key), missing.get(key)), who or ""] for key, label, who in spec]
    return _table(["quantity", "mean [95% CI] (n)", "items"], rows)


def _remedy_table(remedies: dict[str, Any], conditions: dict[str, Any]) -> str:
    rows = []
    for remedy, entry in remedies.items():
        missing = entry.get("not_applicable", {})
        cond = conditions.get(remedy, {})
        reason = (lambda k: "not applicable") if remedy in GAIN_UNDEFINED else missing.get
        if remedy in SAME_AS_REFERENCE and remedy not in conditions:
            rows.append([remedy] + [f"n/a ({CLEAN_RETRY_SEEDED.split(':')[0]})"] + [""] * 7)
            continue
        if remedy in SAME_AS_REFERENCE:
            rows.append([remedy] + ["n/a (G = 0 by construction)"] * 3
                        + [_cell(cond.get("p_repeat")) + " (= before's)", "(the own attempt)", "(the own attempt)",
                           _cell(cond.get("banned_mass")), _cell(cond.get("sampled_repeat_rate"))])
            continue
        rows.append([remedy] + [_cell(entry.get(k), reason(k)) for k in ("gain", "gain_after", "share_removed")]
                    + [_cell(cond.get(k)) for k in ("p_repeat", "greedy_repeat", "greedy_success", "banned_mass",
                                                     "p_sample_repeat")])
    header = ["remedy", "G(remedy)", "G(after), same items", "share of inversion removed",
              "P(repeat)", "greedy repro", "greedy success", "banned mass",
              "P(T=1 sample = failed) (clean_retry: sampled share)"]
    notes = [f"G is not applicable to `{c}`: {reason}." for c, reason in GAIN_UNDEFINED.items() if c in remedies]
    notes += [f"`{c}`: {why}." if c in conditions else f"`{c}`: {CLEAN_RETRY_SEEDED}."
              for c, why in SAME_AS_REFERENCE.items() if c in remedies]
    notes.append("Share of the inversion removed = 1 - mean G(remedy) / mean G(after) on the items having both: "
                 "1 removes it, 0 leaves it, below 0 makes it worse.")
    return _table(header, rows) + "\n\n" + " ".join(notes)


def _sign_reading(name: str, est: dict[str, Any]) -> str:
    mean, lo, hi = est["mean"], est.get("lo"), est.get("hi")
    resolved = lo is not None and (hi < 0 or lo > 0)
    sign = "negative" if mean < 0 else "positive" if mean > 0 else "zero"
    meaning = {"negative": "the failure record made the repeat more likely (backfired)",
               "positive": "the failure record made the repeat less likely (corrected)",
               "zero": "the failure record left the repeat's probability unchanged"}[sign]
    ci = "its 95% CI excludes 0" if resolved else "but its 95% CI includes 0, so the sign is not resolved"
    return f"mean {name} = {_num(mean)} nats is {sign} ({ci}): {meaning}"


def _reading(summary: dict[str, Any], marks: dict[tuple[str, str], str]) -> str:
    conds, dec, rem = summary["conditions"], summary["decomposition"], summary["remedies"]
    after = conds.get("after", {})
    if "gain" not in after:
        return "No reading: G(after) could not be computed (no item has both 'before' and 'after')."
    lines = [_sign_reading("G(after)", after["gain"]) + "."]
    per_token, odds = after.get("gain_per_token"), after.get("odds_factor")
    if per_token and odds:
        direction = "rise" if odds["mean"] > 1 else "fall"
        lines.append(f"Per action token that is {_cell(per_token)} nats: the odds of each failed-action "
                     f"token {direction} by a factor of {_cell(odds)}.")
    if "share_negative" in after:
        share = after["share_negative"]
        lines.append(f"G(after) < 0 on {100 * share['mean']:.0f}% of {share['n']} items "
                     f"(Wilson 95% CI {100 * share['lo']:.0f}-{100 * share['hi']:.0f}%).")
    delta = delta_reading(after)
    if delta:
        lines.append(delta)
    typos = summary.get("without_name_typos") or {}
    if typos.get("n_items") and "gain_per_token" in typos and typos["n_items"] < summary.get("n_items", 0):
        lines.append(f"Without name typos ({typos['n_items']} items): G(after) / token = "
                     f"{_cell(typos['gain_per_token'])}, ΔG / token = {_cell(typos.get('delta_gain_per_token'))}.")
    before = conds.get(REFERENCE, {})
    for key, what in (("p_repeat", "P(repeat) over the candidate set"), ("greedy_repeat", "Greedy exact reproduction")):
        if key in before and key in after and (REFERENCE, key) in marks:
            lines.append(f"{what} after the record: {_cell(after[key])} (before it: not applicable, "
                         f"{marks[REFERENCE, key]}).")
        elif key in before and key in after:
            lines.append(f"{what} goes from {_cell(before[key])} before the record to {_cell(after[key])} after it.")
    if "surface_share" in dec:
        share = dec["surface_share"]
        caveat = " (unstable: the CI of mean G(after) includes 0)" if share.get("unstable") else ""
        lines.append(f"The neutral acknowledgement after the same verbatim call alone gives "
                     f"{100 * share['mean']:.0f}% [{_ci_pct(share)}] of mean G(after){caveat}: that is the surface "
                     "part.")
    shares = {r: e["share_removed"] for r, e in rem.items() if r in REMEDIES and "share_removed" in e}
    if shares:
        if after["gain"]["mean"] >= 0:
            lines.append("G(after) is not negative here, so there is no inversion to remove; the remedy shares "
                         "only compare gains.")
        parts = [f"{r} {100 * s['mean']:.0f}% [{_ci_pct(s)}]{' (unstable)' if s.get('unstable') else ''}"
                 for r, s in shares.items()]
        best = f"; the largest is {max(shares, key=lambda r: shares[r]['mean'])}"
        lines.append("Share of the inversion removed: " + ", ".join(parts) + best + ".")
    retry = summary.get("clean_retry")
    if retry:
        rankings = [f"vs {c}: {est['ranking']}" for c, est in retry.get("minus", {}).items()]
        lines.append(f"Clean retry: a temperature-1 sample from the clean context repeats the failed action with "
                     f"probability exp(lp(before)) = {_cell(retry['p_sample_repeat'])} by construction; paired against "
                     "the harnesses that keep a record: " + ("; ".join(rankings) or "no rival recorded") + ".")
    lines.append(failure_vs_success_answer(summary.get("label") or {}, "Does a failure record make the failed "
                                           "action more likely than the same action shown as a success"))
    for cond in GAIN_UNDEFINED:
        if "p_repeat" in conds.get(cond, {}):
            lines.append(f"Under `{cond}` G is not defined; P(repeat) is {_num(conds[cond]['p_repeat']['mean'])}.")
    return "\n".join(f"- {line}" for line in lines)


def _env_section(env: str, summary: dict[str, Any], marks: dict[tuple[str, str], str]) -> str:
    boot = summary.get("bootstrap", {})
    return "\n\n".join([
        f"## Results: {env}",
        f"{summary['n_items']} items; bootstrap: {boot.get('n_boot')} resamples, seed {boot.get('seed')}.",
        "### Reading\n\n" + _reading(summary, marks),
        "### Conditions\n\n" + _condition_table(summary["conditions"], marks),
        copy_control_section(summary["conditions"]),
        label_section(summary),
        *filter(None, [clean_retry_section(summary)]),
        kinds_section(summary),
        "### Decomposition\n\n" + _decomposition_table(summary["decomposition"]),
        "### Remedies\n\n" + _remedy_table(summary["remedies"], summary["conditions"]),
    ])


def _plots(out_dir: Path) -> str:
    present = [name for name in PLOT_FILES if (out_dir / name).is_file()]
    if not present:
        return "## Plots\n\nNo plot was written."
    return "## Plots\n\n" + "\n\n".join(f"### {PLOT_TITLES[name]}\n\n![{PLOT_TITLES[name]}]({name})"
                                       for name in present)


# ---------------------------------------------------------------- the terminal headline


def construction_marks(failure_source: str | None) -> dict[tuple[str, str], str]:
    """(condition, metric) -> why its value holds by construction under this failure source (then it is not shown)."""
    return {**BY_CONSTRUCTION, **(BY_CONSTRUCTION_MODEL if failure_source == "model" else {})}


def headline(outcome, failure_source: str | None = None) -> list[str]:
    """A few lines for the terminal: each environment's main numbers as `mean [95% CI] (n)`, the same cells as the
    report's (Wilson intervals for shares), and the measured time. `failure_source` is the run's (--failures); a run
    over both sources carries one outcome per source instead."""
    if outcome.by_source:
        lines = []
        for source, sub in outcome.by_source.items():
            lines += [f"[{source}] {line}" for line in headline(sub, source)]
        lines.append(f"measured time, both failure sources: {outcome.total_seconds:.0f} s")
        return lines
    if failure_source is None:
        raise TypeError("headline: a single-source outcome needs its failure source (what holds by construction "
                        "depends on it)")
    marks = construction_marks(failure_source)
    lines = []
    for env, s in outcome.summary.items():
        if env == POOLED:
            continue
        conds = s["conditions"]
        after, before = conds.get("after", {}), conds.get(REFERENCE, {})
        parts = [f"{env}: {s['n_items']} items"]
        if "gain" in after:
            parts.append(f"G(after) = {_cell(after['gain'])} nats, {_cell(after.get('gain_per_token'))} nats/token")
            parts.append(f"share G<0 = {_cell(after.get('share_negative'))} (Wilson)")
            if "delta_gain" in after:
                parts.append(f"differential copy ΔG = G(failed) - G(correct) = {_cell(after['delta_gain'])} nats")
            fs = (s.get("label") or {}).get("label_effect", {}).get("after-success", {}).get("shown", {})
            if "per_call" in fs:
                parts.append(f"failure-specific lp(after) - lp(success) = {_cell(fs['per_call'])} nats")
        for key, label in (("p_repeat", "P(repeat)"), ("greedy_repeat", "greedy repro (Wilson)")):
            if key in before and key in after:
                # Under the model's own failures the failed action IS the greedy completion of `before`.
                shown = f"not applicable ({marks[REFERENCE, key]})" if (REFERENCE, key) in marks else _cell(before[key])
                parts.append(f"{label} {shown} -> {_cell(after[key])}")
        lines.append("; ".join(parts))
    if POOLED in outcome.summary:
        lines.append(pooled_line(outcome.summary[POOLED]))
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in outcome.stage_seconds.items())
    lines.append(f"measured time: {outcome.total_seconds:.0f} s ({stages})")
    if outcome.n_resumed:
        lines.append(f"({outcome.n_resumed} items were already complete from the interrupted run)")
    if outcome.n_item_errors:
        lines.append(f"{outcome.n_item_errors} item(s) could not be scored; reasons in the report")
    return lines
