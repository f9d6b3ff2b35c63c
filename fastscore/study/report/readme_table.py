"""The paper-vs-study table, generated from a study's summary.json (never written by hand).

Each row is a claim of the paper's abstract, the paper's value, the study's estimate in every scope the summary has
(failure source × environment: mean [95% CI] (n)) and a verdict computed from those intervals:

- reproduced: the CI lies wholly on the paper's side of the claim's null (for an "≈ 0" claim: the CI lies within the
  claim's equivalence margin, whether or not it excludes 0);
- not reproduced: the CI lies wholly on the other side (for "≈ 0": wholly outside the margin);
- not measurable: no estimate, fewer than MIN_N items, a saturated metric (at its bound on every item), or a CI
  that includes the null.

These verdicts are about the claim's direction. Where the paper gives a number (`Claim.paper_value`, a point or a
range), a reproduced row also says whether that number lies inside the study's CIs: "reproduced (direction only: the
paper's value lies outside the CI)" means the sign holds and the size differs.

A row whose scopes disagree says which scopes reproduce. A README holds the table between the markers
`<!-- study-table:begin -->` and `<!-- study-table:end -->`; `--check` fails when that block differs from the table
generated now, `--write` replaces it.

    python -m fastscore.study.report.readme_table RESULTS_DIR                  # print the table (markdown)
    python -m fastscore.study.report.readme_table RESULTS_DIR --check README.md  # exit 1 if the README's block drifted
    python -m fastscore.study.report.readme_table RESULTS_DIR --write README.md  # rewrite the README's block
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastscore.errors import DataError
from fastscore.study.analysis.power import MIN_ITEMS
from fastscore.study.report.markdown import cell, num, table

BEGIN = "<!-- study-table:begin -->"
END = "<!-- study-table:end -->"
SOURCES = ("seeded", "model")
NOT_SCOPES = ("pooled", "failure_prior")
REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE = "reproduced", "not reproduced", "not measurable"
EQUIVALENCE_SHARE = 0.25  # an "≈ 0" share claim holds when the whole CI lies within ±25 percentage points
MIN_N = MIN_ITEMS  # below it a percentile bootstrap is no interval: no verdict

Getter = Callable[[dict[str, Any]], dict[str, Any] | None]


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    get: Getter  # one environment summary -> the estimate (mean/lo/hi/n), or None
    null: float  # the value the claim is tested against
    side: int  # +1: the paper's claim is above the null, -1: below, 0: the claim is "≈ null"
    paper_value: tuple[float, float] | None = None  # the paper's number as a [low, high] range (a point: low = high)


def _path(*keys: str) -> Getter:
    def get(s: dict[str, Any]) -> dict[str, Any] | None:
        for key in keys:
            if not isinstance(s, dict) or key not in s:
                return None
            s = s[key]
        return s

    return get


# Under the model's own failures the failed action is the model's greedy attempt from `before`: greedy decoding
# there reproduces it on every item by construction.
BEFORE_BY_CONSTRUCTION_ON_POLICY = ("greedy_repeat",)


def _repeat_rise(metric: str) -> Getter:
    """after - before of a share, as an interval difference (after's low end over before's high end)."""
    def get(s: dict[str, Any]) -> dict[str, Any] | None:
        before, after = _path("conditions", "before", metric)(s), _path("conditions", "after", metric)(s)
        if before is None or after is None:
            return None
        rise = {"mean": after["mean"] - before["mean"], "n": min(after["n"], before["n"])}

        def no_interval(why: str, note: str) -> dict[str, Any]:
            return {**rise, "lo": None, "hi": None, "saturated": why, "note": note}

        if s.get("failures") == "model" and metric in BEFORE_BY_CONSTRUCTION_ON_POLICY:
            return no_interval("before is the model's own greedy attempt, repeated by construction",
                               f"by construction: {num(before['mean'])} ({before['n']}) -> {cell(after)}")
        sides = [side for side, est in (("before", before), ("after", after)) if est.get("saturated")]
        if sides:  # a side at its bound on every item: the difference is no finding
            return no_interval(f"{sides[0]} at its bound on every item" if len(sides) == 1
                               else "both at their bounds on every item", f"{cell(before)} -> {cell(after)}")
        if after.get("lo") is None or before.get("lo") is None:
            return None
        return {**rise, "lo": after["lo"] - before["hi"], "hi": after["hi"] - before["lo"],
                "note": f"{cell(before)} -> {cell(after)}"}

    return get


CLAIMS = (
    Claim("G per action token (nats)", "−1.03", _path("conditions", "after", "gain_per_token"), 0.0, -1,
          (-1.03, -1.03)),
    Claim("odds of each failed-action token", "×2.8", _path("conditions", "after", "odds_factor"), 1.0, +1,
          (2.8, 2.8)),
    Claim("share of items with G < 0", "90–100%", _path("conditions", "after", "share_negative"), 0.5, +1,
          (0.9, 1.0)),
    Claim("failure-specific: lp(after) − lp(success) of the failed action, per token (nats)",
          "small, sign inconsistent", _path("label", "label_effect", "after-success", "shown", "per_token"), 0.0, 0),
    Claim("P(repeat) over the candidate set, after − before", "0.06 → 0.54", _repeat_rise("p_repeat"), 0.0, +1,
          (0.48, 0.48)),
    Claim("greedy reproduction of the failed call, after − before", "0% → 19%", _repeat_rise("greedy_repeat"),
          0.0, +1, (0.19, 0.19)),
    # "Most of" the inversion: the share is tested against one half, not against 0.
    Claim("surface share: mean G(neutral) / mean G(after)", "83%", _path("decomposition", "surface_share"), 0.5, +1,
          (0.83, 0.83)),
    Claim("description: share of the inversion removed", "76%",
          _path("remedies", "description", "share_removed"), 0.5, +1, (0.76, 0.76)),
    Claim("\"do not repeat\": share of the inversion removed", "≈ 0",
          _path("remedies", "dont_repeat", "share_removed"), 0.0, 0),
    Claim("clean retry − after: P(T=1 sample = failed), paired", "clean retry worst (> 0)",
          _path("clean_retry", "minus", "after"), 0.0, +1),
)


def verdict(est: dict[str, Any] | None, claim: Claim) -> str:
    if est is None or est.get("saturated") or est.get("lo") is None or est.get("n", 0) < MIN_N:
        return NOT_MEASURABLE
    lo, hi = est["lo"], est["hi"]
    if claim.side == 0:
        # Equivalence (two one-sided tests at the margin): a CI inside the margin shows "≈ null" even when it
        # excludes the null itself (a small effect measured precisely is still ≈ 0); a CI wholly outside the margin
        # refutes it; anything else cannot tell. The per-token label claim uses the same margin in nats.
        if claim.null - EQUIVALENCE_SHARE <= lo and hi <= claim.null + EQUIVALENCE_SHARE:
            return REPRODUCED
        if lo > claim.null + EQUIVALENCE_SHARE or hi < claim.null - EQUIVALENCE_SHARE:
            return NOT_REPRODUCED
        return NOT_MEASURABLE
    if lo > claim.null:
        return REPRODUCED if claim.side > 0 else NOT_REPRODUCED
    if hi < claim.null:
        return REPRODUCED if claim.side < 0 else NOT_REPRODUCED
    return NOT_MEASURABLE


def paper_value_inside(est: dict[str, Any] | None, claim: Claim) -> bool | None:
    """Does the paper's number (range) overlap the estimate's CI? None without a number or an interval."""
    if claim.paper_value is None or est is None or est.get("lo") is None or est.get("hi") is None:
        return None
    low, high = claim.paper_value
    return est["lo"] <= high and low <= est["hi"]


def _value_note(claim: Claim, estimates: dict[str, dict[str, Any] | None], verdicts: dict[str, str]) -> str:
    """For the scopes whose direction is reproduced: is the paper's number inside their CI?"""
    inside = {scope: paper_value_inside(est, claim) for scope, est in estimates.items()
              if verdicts[scope] == REPRODUCED}
    inside = {scope: v for scope, v in inside.items() if v is not None}
    if not inside:
        return ""
    if all(inside.values()):
        return " (the paper's value lies inside the CI)" if len(inside) == 1 else \
            " (the paper's value lies inside every CI)"
    if not any(inside.values()):
        return " (direction only: the paper's value lies outside the CI)" if len(inside) == 1 else \
            " (direction only: the paper's value lies outside every CI)"
    return (" (the paper's value lies inside the CI in " + ", ".join(s for s, v in inside.items() if v)
            + ", outside in " + ", ".join(s for s, v in inside.items() if not v) + ")")


def scopes(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`source env` -> the environment summary, for a summary keyed by source (`--failures both`) or one source's."""
    if any(source in summary for source in SOURCES):
        return {f"{source} {env}": {**s, "failures": source} for source in SOURCES
                for env, s in (summary.get(source) or {}).items() if env not in NOT_SCOPES}
    return {env: s for env, s in summary.items() if env not in NOT_SCOPES}


def _row_verdict(verdicts: dict[str, str], value_note: str = "") -> str:
    """One verdict when every scope agrees, else each verdict with its scopes; `value_note` (about the reproduced
    scopes) follows the reproduced part."""
    if len(set(verdicts.values())) == 1:
        only = next(iter(verdicts.values()))
        return only + (value_note if only == REPRODUCED else "")
    return "; ".join(f"{v}: {', '.join(s for s, x in verdicts.items() if x == v)}"
                     + (value_note if v == REPRODUCED else "")
                     for v in (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE) if v in verdicts.values())


def _cell(est: dict[str, Any] | None) -> str:
    if est is None:
        return "no estimate"
    if est.get("saturated") and est.get("note"):  # a difference of two sides, one saturated: say which
        text = f"{num(est['mean'])} ({est['n']}; not measurable: {est['saturated']})"
    else:
        text = cell(est)
    return f"{text}, {est['note']}" if est.get("note") and "->" in est["note"] else text


def study_table(summary: dict[str, Any]) -> str:
    """The markdown table of every claim (deterministic: the same summary gives the same bytes)."""
    by_scope = scopes(summary)
    if not by_scope:
        raise DataError("the summary holds no environment to tabulate")
    rows = []
    for claim in CLAIMS:
        estimates = {scope: claim.get(s) for scope, s in by_scope.items()}
        verdicts = {scope: verdict(est, claim) for scope, est in estimates.items()}
        study = "; ".join(f"{scope}: {_cell(est)}" for scope, est in estimates.items())
        rows.append([claim.claim, claim.paper, study, _row_verdict(verdicts, _value_note(claim, estimates, verdicts))])
    return table(["claim in the abstract", "paper", "this study: mean [95% CI] (n) per source and environment",
                  "verdict"], rows)


def block(generated: str) -> str:
    return f"{BEGIN}\n{generated.rstrip()}\n{END}"


def extract_block(markdown: str) -> str:
    """The text between the markers (exclusive), stripped; DataError if they are missing or out of order."""
    start, stop = markdown.find(BEGIN), markdown.find(END)
    if start < 0 or stop < 0 or stop < start or markdown.count(BEGIN) != 1 or markdown.count(END) != 1:
        raise DataError(f"expected exactly one {BEGIN} ... {END} block")
    return markdown[start + len(BEGIN):stop].strip()


def replace_block(markdown: str, generated: str) -> str:
    extract_block(markdown)  # the markers are checked before anything is replaced
    start, stop = markdown.find(BEGIN), markdown.find(END) + len(END)
    return markdown[:start] + block(generated) + markdown[stop:]


def load_summary(results: Path) -> dict[str, Any]:
    path = Path(results)
    path = path / "summary.json" if path.is_dir() else path
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read the study summary {path}: {exc}") from exc


def drifted(results: Path, markdown_path: Path) -> bool:
    """True when the markdown's study-table block differs from the table generated from `results`."""
    generated = study_table(load_summary(results)).strip()
    return extract_block(Path(markdown_path).read_text(encoding="utf-8")) != generated


def run(results: Path, check: Path | None = None, write: Path | None = None) -> tuple[bool, str]:
    """(ok, text): the table; with `check`, whether the markdown's block matches it; with `write`, the block replaced.
    The one implementation behind `fastscore study-table` and `python -m fastscore.study.report.readme_table`."""
    if check and write:
        raise DataError("--check and --write exclude each other")
    generated = study_table(load_summary(results))
    if check:
        if drifted(results, check):
            return False, (f"{check}: the study table differs from {results}; regenerate it with "
                           f"fastscore study-table {results} --write {check}")
        return True, f"{check}: the study table matches {results}"
    if write:
        Path(write).write_text(replace_block(Path(write).read_text(encoding="utf-8"), generated), encoding="utf-8")
        return True, f"wrote the study table into {write}"
    return True, generated


def main(argv: list[str]) -> int:
    usage = "usage: python -m fastscore.study.report.readme_table RESULTS_DIR|summary.json [--check|--write MARKDOWN]"
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] not in ("--check", "--write")):
        print(usage, file=sys.stderr)
        return 2
    target = Path(argv[2]) if len(argv) == 3 else None
    try:
        ok, text = run(Path(argv[0]), check=target if argv[1:2] == ["--check"] else None,
                       write=target if argv[1:2] == ["--write"] else None)
    except (DataError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(text, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
