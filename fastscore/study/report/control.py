"""Report sections for the copy control, the failure kinds and the pooled estimate."""

from __future__ import annotations

from typing import Any

from fastscore.study.analysis.control import NAME_TYPOS
from fastscore.study.data.conditions import GAIN_CONDITIONS
from fastscore.study.data.envs import seeded_mix_rules
from fastscore.study.report.label import kind_label_cell
from fastscore.study.report.markdown import cell, num, table


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


def pooled_section(pooled: dict[str, Any]) -> str:
    return ("## Pooled over environments\n\n" + pooled.get("method", "") + ".\n\n"
            + table(HEADLINE_HEADER, [headline_row(" + ".join(pooled.get("envs", [])), pooled)]))


def pooled_line(pooled: dict[str, Any]) -> str:
    """The terminal's line for the estimate pooled over environments (next to the per-environment lines)."""
    return (f"pooled ({' + '.join(pooled.get('envs', []))}): {pooled.get('n_items', 0)} items; "
            f"G(after) = {cell(pooled.get('gain_per_token'))} nats/token; "
            f"differential copy ΔG = {cell(pooled.get('delta_gain_per_token'))} nats/token; "
            f"share G<0 = {cell(pooled.get('share_negative'))} (Wilson)")
