"""Report sections for the copy control, the failure kinds, the pooled estimate and the failure sources side by side."""

from __future__ import annotations

from typing import Any

from fastscore.study.data.conditions import GAIN_CONDITIONS
from fastscore.study.data.envs import seeded_mix_rules
from fastscore.study.analysis.control import NAME_TYPOS
from fastscore.study.analysis.power import SATURATED


def num(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.2e}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:.3f}"


def cell(entry: dict[str, Any] | None, reason: str | None = None) -> str:
    if entry is None:
        return f"n/a ({reason})" if reason else "n/a"
    ci = "[n/a]" if entry.get("lo") is None else f"[{num(entry['lo'])}, {num(entry['hi'])}]"
    flag = " ⚠" if entry.get("unstable") else ""
    if entry.get("saturated"):  # at its bound on every item: the CI is set by n alone, no finding
        return f"{SATURATED}: {num(entry['mean'])} ({entry['n']})"
    return f"{num(entry['mean'])} {ci} ({entry['n']}){flag}"


def ci_pct(est: dict[str, Any]) -> str:
    """A share's CI in percent: `lo, hi%`."""
    if est.get("lo") is None:
        return "n/a"
    lo, hi = (round(100 * est[k]) for k in ("lo", "hi"))  # ints: a bound just below 0 prints as 0, not -0
    return f"{lo}, {hi}%"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


COPY_COLUMNS = (
    ("gain_per_token", "G(failed) / token"),
    ("gain_correct_per_token", "G(correct) / token"),
    ("delta_gain", "ΔG = G(failed) - G(correct), total"),
    ("delta_gain_per_token", "ΔG / token"),
    ("share_delta_negative", "share ΔG < 0"),
    ("gain_per_token_shared", "G / token, tokens shared with the correct action"),
    ("gain_per_token_edited", "G / token, the edit"),
)


def copy_control_section(conditions: dict[str, Any]) -> str:
    rows = [[c] + [cell(conditions[c].get(k)) for k, _ in COPY_COLUMNS] for c in GAIN_CONDITIONS if c in conditions]
    intro = ("Any string shown in the context gets copied, so the correct action (candidate 1) is scored in the same "
             "contexts as a control. ΔG (the differential copy) is how much more the shown string gains than the "
             "correct one; it is the same under the success and neutral records, so it is copying, not an effect of "
             "the failure label (see the label contrasts); the last two "
             "columns split the failed action's per-token G into the tokens it shares with the correct action "
             "(copying) and its edited tokens (the error itself). All from the stored candidate log-probs; "
             "percentile-bootstrap CIs over items, Wilson for the share.")
    return "### Copy control: failed vs correct action\n\n" + intro + "\n\n" + table(
        ["condition"] + [label for _, label in COPY_COLUMNS], rows)


def delta_reading(after: dict[str, Any]) -> str | None:
    """The Reading's sentence on the differential copy ΔG, with its CI (copying, not the failure label)."""
    delta = after.get("delta_gain")
    if delta is None:
        return None
    lo, hi = delta.get("lo"), delta.get("hi")
    resolved = lo is not None and (hi < 0 or lo > 0)
    if delta["mean"] < 0:
        what = "negative: the record raised the failed action more than the correct one"
    else:
        what = "not negative: the record raised the correct action at least as much as the failed one"
    sign = "its 95% CI excludes 0" if resolved else "its 95% CI includes 0, so its sign is not resolved"
    text = (f"The differential copy ΔG = G(failed) - G(correct) (copying of the shown string over the correct one, "
            f"under any label; the failure label's own effect is in the label contrasts) is {num(delta['mean'])} nats "
            f"[{num(lo) if lo is not None else 'n/a'}, {num(hi) if hi is not None else 'n/a'}] (n={delta['n']}), "
            f"{what} ({sign}); G(correct) = {num(after['gain_correct']['mean'])} nats is the copying any shown "
            f"string gets.")
    if "gain_per_token_edited" in after and "gain_per_token_shared" in after:
        text += (f" Per token, the edit moves by {num(after['gain_per_token_edited']['mean'])} nats and the tokens "
                 f"shared with the correct action by {num(after['gain_per_token_shared']['mean'])}.")
    return text


def headline_row(label: str, h: dict[str, Any]) -> list[str]:
    from fastscore.study.report.label import kind_label_cell  # it renders with this module's cells

    return [label, str(h.get("n_items", 0)), cell(h.get("gain_per_token")), cell(h.get("delta_gain_per_token")),
            kind_label_cell(h), cell(h.get("share_negative")), cell(h.get("p_repeat_before")),
            cell(h.get("p_repeat_after")), cell(h.get("greedy_repeat_before")), cell(h.get("greedy_repeat_after"))]


HEADLINE_HEADER = ["items", "n", "G(after) / token", "differential copy ΔG / token",
                   "failure-specific lp(after) - lp(success) / token", "share G < 0", "P(repeat) before",
                   "P(repeat) after", "greedy repro before", "greedy repro after"]


def kinds_section(summary: dict[str, Any]) -> str:
    kinds = summary.get("by_kind") or {}
    rows = [headline_row(kind, h) for kind, h in kinds.items()]
    if summary.get("without_name_typos"):
        rows.append(headline_row("**all but name typos**", summary["without_name_typos"]))
    mix = ", ".join(f"{kind} {h.get('n_items', 0)}" for kind, h in kinds.items())
    return ("### Failure kinds\n\nThe mix used: " + (mix or "not recorded") + f". Name typos ({', '.join(NAME_TYPOS)}) "
            "are the lowest-prior strings with the largest copy boost; the last row leaves them out.\n\n"
            + table(HEADLINE_HEADER, rows))


def seeded_mix_text(envs) -> str:
    """The run-parameter line: each environment's rule, or that it states none (its counts per kind still show)."""
    rules = seeded_mix_rules(envs)
    return "; ".join(f"{env}: {rules.get(env, 'no rule stated (the counts per failure kind are in its section)')}"
                     for env in envs)


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


def pooled_section(pooled: dict[str, Any]) -> str:
    return ("## Pooled over environments\n\n" + pooled.get("method", "") + ".\n\n"
            + table(HEADLINE_HEADER, [headline_row(" + ".join(pooled.get("envs", [])), pooled)]))


def pooled_line(pooled: dict[str, Any]) -> str:
    """The terminal's line for the estimate pooled over environments (next to the per-environment lines)."""
    return (f"pooled ({' + '.join(pooled.get('envs', []))}): {pooled.get('n_items', 0)} items; "
            f"G(after) = {cell(pooled.get('gain_per_token'))} nats/token; "
            f"differential copy ΔG = {cell(pooled.get('delta_gain_per_token'))} nats/token; "
            f"share G<0 = {cell(pooled.get('share_negative'))} (Wilson)")


def sources_report(by_source: dict[str, dict[str, Any]], links: dict[str, str], meta_lines: list[str],
                   prior: dict[str, Any] | None = None) -> str:
    """The top-level report of a run over several failure sources: the headline side by side, links to each;
    `prior` (fastscore.study.analysis.prior.prior_summary) adds "The failure's prior" when both sources are in the run."""
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
        _redactions(by_source),
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
    from fastscore.study.report.prior import prior_section  # it renders with this module's cells

    section = prior_section(prior) if {"seeded", "model"} <= set(by_source) else None
    return [section] if section else []


def _redactions(by_source: dict[str, dict[str, Any]]) -> str:
    from fastscore.study.analysis.redactions import redaction_section  # it builds on this module's table helpers

    return redaction_section(by_source)


def _sensitivity_by_source(by_source: dict[str, dict[str, Any]]) -> list[str]:
    from fastscore.study.report.sensitivity import HEADING, sensitivity_section

    sections = {source: sensitivity_section(summary) for source, summary in by_source.items()}
    return [text.replace(HEADING, f"{HEADING} ({source} failures)", 1) for source, text in sections.items() if text]


def _env_headline(s: dict[str, Any]) -> dict[str, Any]:
    after, before = s.get("conditions", {}).get("after", {}), s.get("conditions", {}).get("before", {})
    out = {"n_items": s.get("n_items", 0)}
    for k in ("gain_per_token", "delta_gain_per_token", "share_negative"):
        if k in after:
            out[k] = after[k]
    from fastscore.study.report.label import env_label_headline

    out["label"] = env_label_headline(s)
    for k in ("p_repeat", "greedy_repeat"):
        if k in before:
            out[f"{k}_before"] = before[k]
        if k in after:
            out[f"{k}_after"] = after[k]
    return out
