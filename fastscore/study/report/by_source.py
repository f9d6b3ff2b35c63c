"""The report of a run over both failure sources: the headline, the failure mix, the prior, the redactions, clean
retry and the sensitivity checks, each source side by side."""

from __future__ import annotations

from typing import Any

from fastscore.study.data.envs import seeded_mix_rules
from fastscore.study.report.control import HEADLINE_HEADER, headline_row
from fastscore.study.report.label import env_label_headline
from fastscore.study.report.markdown import cell, table
from fastscore.study.report.prior import prior_section
from fastscore.study.report.redactions import redaction_section
from fastscore.study.report.sensitivity import HEADING, sensitivity_section


def _kind_counts(summary: dict[str, Any]) -> str:
    kinds = summary.get("by_kind") or {}
    return ", ".join(f"{kind} {h.get('n_items', 0)}" for kind, h in kinds.items()) or "not recorded"


def mix_section(by_source: dict[str, dict[str, Any]]) -> str:
    """The failure kinds each source's items have, per environment side by side, with the seeded rule."""
    envs = list(dict.fromkeys(env for summary in by_source.values() for env in summary if env != "pooled"))
    rows = [[env] + [_kind_counts(by_source[source].get(env, {})) for source in by_source] for env in envs]
    rules = seeded_mix_rules(envs)
    text = ("## Failure mix\n\nItems per failure kind (on-policy kinds are `model:` and the runtime's or tests' "
            "verdict on the model's own attempt).")
    if "seeded" in by_source and rules:
        text += " Seeded failure mix: " + "; ".join(f"{env}: {rule}" for env, rule in rules.items()) + "."
    return text + "\n\n" + table(["env", *(f"{source}: items per kind" for source in by_source)], rows)


def sources_report(by_source: dict[str, dict[str, Any]], links: dict[str, str], meta_lines: list[str],
                   prior: dict[str, Any] | None = None) -> str:
    """The top-level report of a run over several failure sources: the headline side by side, links to each;
    `prior` (fastscore.study.analysis.prior.prior_summary) adds "The failure's prior" when both sources are in the
    run."""
    rows = []
    for source, summary in by_source.items():
        for key, s in summary.items():
            row = headline_row(f"{source}: {key}", s if key == "pooled" else _env_headline(s))
            if source == "model":  # the failure is the model's greedy attempt from the before context
                row[-2] = "not applicable (by construction: the model's own attempt)"
            rows.append(row)
            typos = (s.get("without_name_typos") or {}) if key != "pooled" else {}
            if typos.get("n_items") and typos["n_items"] < s.get("n_items", 0):
                rows.append(headline_row(f"{source}: {key}, without name typos", typos))
    retry = []
    for source, summary in by_source.items():
        for env, s in summary.items():
            if env == "pooled":
                continue
            conds = s.get("conditions", {})
            clean = conds.get("clean_retry", {}).get("sampled_repeat_rate")
            if clean is None:
                retry.append([source, env, "not applicable (seeded failures)"] + [""] * 5)
                continue
            semantic = conds.get("clean_retry", {}).get("sampled_repeat_semantic_rate")
            retry.append([source, env, cell(clean), cell(semantic) if semantic else "not recorded"]
                         + [cell(conds.get(c, {}).get("p_sample_repeat")) for c in
                            ("after", "description", "dont_repeat", "before")])
    return "\n\n".join([
        "# fastscore study: both failure sources side by side",
        *meta_lines,
        "Seeded: one-edit mutations of the ground truth (tools: or the ground truth written as prose instead of a "
        "call) that the runtime / tests reject. Model: the model's own "
        "greedy attempt from the clean context, kept only when really rejected. Each source's full report: "
        + ", ".join(f"[{s}]({link})" for s, link in links.items()) + ".",
        "## Headline\n\n" + table(HEADLINE_HEADER, rows),
        mix_section(by_source),
        *_prior(by_source, prior),
        redaction_section(by_source),
        "## Clean retry\n\nShare of k sampled retries (temperature 1.0, seeded) from the clean context that "
        "reproduce the failed action token for token, next to the exact probability exp(lp) that one temperature-1 "
        "sample reproduces it under the other harnesses. The clean context is `before`'s, so the retries estimate "
        "exp(lp(before)) (last column), **by construction**; token for token they add no information beyond it. "
        "Judged in meaning (the same call after argument normalisation; the same failing test outcome), as the greedy "
        "repeats are, they measure what exp(lp) cannot: how often a retry makes the same mistake in another spelling. "
        "Which harness repeats more is stated in each source's report only where the paired CI excludes the tie. "
        "Under seeded failures the failed action did not come from the clean context, so clean retry is not "
        "applicable there.\n\n"
        + table(["source", "env", "clean retry: sampled share repeating", "... in meaning", "after: exp(lp)",
                 "description: exp(lp)",
                 "dont_repeat: exp(lp)", "before: exp(lp) (= clean context)"], retry),
        *_sensitivity_by_source(by_source),
    ])


def _prior(by_source: dict[str, dict[str, Any]], prior: dict[str, Any] | None) -> list[str]:
    section = prior_section(prior) if {"seeded", "model"} <= set(by_source) else None
    return [section] if section else []


def _sensitivity_by_source(by_source: dict[str, dict[str, Any]]) -> list[str]:
    sections = {source: sensitivity_section(summary) for source, summary in by_source.items()}
    return [text.replace(HEADING, f"{HEADING} ({source} failures)", 1) for source, text in sections.items() if text]


def _env_headline(s: dict[str, Any]) -> dict[str, Any]:
    after, before = s.get("conditions", {}).get("after", {}), s.get("conditions", {}).get("before", {})
    out = {"n_items": s.get("n_items", 0)}
    for k in ("gain_per_token", "delta_gain_per_token", "share_negative"):
        if k in after:
            out[k] = after[k]
    out["label"] = env_label_headline(s)
    for k in ("p_repeat", "greedy_repeat"):
        if k in before:
            out[f"{k}_before"] = before[k]
        if k in after:
            out[f"{k}_after"] = after[k]
    return out
