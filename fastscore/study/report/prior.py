"""The report section "The failure's prior" (fastscore.study.analysis.prior), rendered from its summary.json entry.

Re-render it from a finished run over both failure sources: `python -m fastscore.study.report.prior OUT_DIR`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fastscore.study.analysis.prior import MIN_ITEMS, MODEL, NOT_APPLICABLE, POOLED, SEEDED
from fastscore.study.report.markdown import cell, ci_pct, num, table

HEADING = "## The failure's prior: a ceiling, not a finding"
# Why the section is a ceiling: it leads the section, before any number.
CEILING = (
    "**This section states a bound, not a finding.** G/token = prior - lp(failed | after)/n and lp <= 0, so G/token "
    "is never below the failed action's prior per token: an item whose failed action was already likely before the "
    "record (the model's own attempt) has no room for a large negative G, by construction. The gap between the "
    "sources is largely that identity; only the adjusted gap below (at equal prior) asks more of the data, and it "
    "rests on a linear fit.")
SUMMARY_KEY = "failure_prior"
# Fewer than this share of a source's items in the common prior range: the adjusted gap is mostly extrapolation.
THIN_OVERLAP = 1 / 3


def _value(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "n/a"
    return entry[NOT_APPLICABLE] if NOT_APPLICABLE in entry else cell(entry)


def _bin_range(b: dict[str, Any]) -> str:
    lo, hi = b["prior_from"], b["prior_to"]  # None: open on that side
    if lo is None:
        return f"{b['label']}: < {num(hi)}"
    if hi is None:
        return f"{b['label']}: ≥ {num(lo)}"
    return f"{b['label']}: {num(lo)} to < {num(hi)}"


def _resolved(e: dict[str, Any]) -> bool:
    return e.get("lo") is not None and (e["hi"] < 0 or e["lo"] > 0)


def _ci(e: dict[str, Any]) -> str:
    return f"{num(e['mean'])} [{num(e['lo'])}, {num(e['hi'])}]" if e.get("lo") is not None else f"{num(e['mean'])}"


def _overlap_text(overlap: dict[str, Any]) -> str:
    inside = overlap.get("items_inside") or {}
    if overlap.get("prior_from") is None:
        return "none"
    return (f"{num(overlap['prior_from'])} to {num(overlap['prior_to'])}: {inside.get(MODEL, 0)} on-policy, "
            f"{inside.get(SEEDED, 0)} seeded")


def prior_reading(scopes: dict[str, Any]) -> str:
    """One sentence: does the source gap survive adjustment for prior, with its CI (pooled, else the one env)."""
    scope = POOLED if POOLED in scopes else next(iter(scopes))
    a = scopes[scope]
    gap, n = a["gap"], a["n"]
    raw, adj = gap["raw"], gap["adjusted_for_prior"]
    where = "pooled over environments" if scope == POOLED else f"in {scope}"
    if NOT_APPLICABLE in raw or NOT_APPLICABLE in adj:
        return (f"**Reading** ({where}): the gap cannot be adjusted for prior here: "
                f"{adj.get(NOT_APPLICABLE) or raw.get(NOT_APPLICABLE)}.")
    text = (f"**Reading** ({where}, {n[MODEL]} on-policy and {n[SEEDED]} seeded items): the gap in G/token, "
            f"on-policy minus seeded, is {_ci(raw)} nats raw and {_ci(adj)} at equal prior; ")
    share = gap["share_remaining"]
    share_text = "" if NOT_APPLICABLE in share else (
        f"; {round(100 * share['mean'])}% [{ci_pct(share)}] of the raw gap remains"
        + (" (unstable: the raw gap's CI includes 0)" if share.get("unstable") else ""))
    if not _resolved(raw) and not _resolved(adj):
        text += ("neither the raw nor the adjusted gap is resolved (both 95% CIs include 0)" + share_text
                 + ", so at this n the run cannot tell whether the prior explains the gap.")
    elif not _resolved(adj):
        text += ("the gap does **not** survive adjustment for prior: its 95% CI includes 0" + share_text
                 + ". That fits the prior explaining the gap, but at this n a gap within that interval is not ruled "
                   "out.")
    elif (adj["mean"] > 0) == (raw["mean"] > 0):
        text += ("the gap **survives** adjustment for prior (its 95% CI excludes 0" + share_text
                 + "): the prior does not explain all of it.")
    else:
        text += "at equal prior the gap **reverses sign** (its 95% CI excludes 0" + share_text + ")."
    overlap = gap.get("overlap", {})
    inside = overlap.get("items_inside") or {}
    if overlap.get("prior_from") is None:
        text += (" Caution: the sources' priors do not overlap at all, so the adjusted gap extrapolates the linear "
                 "fit rather than comparing matched items.")
    elif any(inside.get(s, 0) < max(MIN_ITEMS, THIN_OVERLAP * n[s]) for s in (MODEL, SEEDED)):
        text += (f" Caution: the sources' priors barely overlap (only {inside.get(MODEL, 0)} on-policy and "
                 f"{inside.get(SEEDED, 0)} seeded items lie in the prior range both cover), so the adjusted gap rests "
                 "mostly on the linear fit's extrapolation rather than on matched items.")
    return text


def prior_section(prior: dict[str, Any] | None) -> str | None:
    """The section, or None when the run has no prior analysis (not both failure sources, or no common env)."""
    scopes = (prior or {}).get("scopes") or {}
    if not scopes:
        return None
    bins = [[scope, _bin_range(b), _value(b["mean_prior"].get(SEEDED)), _value(b["gain_per_token"].get(SEEDED)),
             _value(b["mean_prior"].get(MODEL)), _value(b["gain_per_token"].get(MODEL)), _value(b["gap"])]
            for scope, a in scopes.items() for b in a["bins"]]
    gaps = [[scope, f"{a['n'][MODEL]} + {a['n'][SEEDED]}", _value(a["mean_prior"].get(SEEDED)),
             _value(a["mean_prior"].get(MODEL)), _value(a["gap"]["raw"]), _value(a["gap"]["adjusted_for_prior"]),
             _value(a["gap"]["prior_slope"]), _value(a["gap"]["share_remaining"]), _overlap_text(a["gap"]["overlap"])]
            for scope, a in scopes.items()]
    boot = prior.get("bootstrap", {})
    intro = (
        "Is the gap in G between the two failure sources the model's prior on the failed action? The prior is the "
        "failed action's log-probability per token in the `before` context (nats/token; 0 = certain): the model's "
        "own greedy attempt is likely there, a seeded mutation is not, and a copy boost has more room to raise an "
        "unlikely string. G/token is the headline's (G = lp(before) - lp(after), negative = backfired), so a positive "
        "gap (on-policy minus seeded) means the model's own failures backfire less. Since lp(after) <= 0, G/token is "
        "never below the prior: a prior near 0 leaves no room for a large negative G, by construction. Bins: "
        "terciles of the pooled prior of both sources in each scope (about a third of the items each, on the model's "
        "own scale; fixed edges would have to guess it). Adjusted: the on_policy coefficient of least squares "
        "G/token ~ 1 + prior + on_policy, pooled with one intercept per environment (the gap at equal prior, if the "
        "prior acts linearly and alike on both sources). Percentile-bootstrap 95% CIs with items resampled within "
        f"each source ({boot.get('n_boot', '?')} resamples, seed {boot.get('seed', '?')}); a cell with fewer than "
        f"{MIN_ITEMS} items of a source says so.")
    return "\n\n".join([
        HEADING, CEILING, intro,
        table(["scope", "prior bin (nats/token)", "seeded: mean prior", "seeded: G/token", "on-policy: mean prior",
               "on-policy: G/token", "gap: on-policy - seeded"], bins),
        table(["scope", "n (on-policy + seeded)", "seeded: mean prior", "on-policy: mean prior",
               "gap, raw", "gap at equal prior", "prior slope (G/token per nat/token)", "share of raw gap remaining",
               "common prior range: items"], gaps),
        prior_reading(scopes),
    ])


def main(argv: list[str]) -> int:
    from fastscore.study.analysis.prior import prior_of_run

    logprobs = "--from-logprobs" in argv
    args = [a for a in argv if a != "--from-logprobs"]
    if len(args) != 1:
        print("usage: python -m fastscore.study.report.prior OUT_DIR [--from-logprobs]  (a run over both failure "
              "sources; --from-logprobs reads the scoring stage's log-probs, before the greedy stages finish)",
              file=sys.stderr)
        return 2
    prior = prior_of_run(Path(args[0]), from_logprobs=logprobs)
    text = prior_section(prior)
    if text is None:
        print(f"{args[0]}: no prior analysis (the run lacks a failure source or an environment both share)",
              file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
