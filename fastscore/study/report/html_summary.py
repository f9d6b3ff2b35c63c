"""report.html's summary: the opening (n, what G means, how the intervals were made) and the per-condition tables,
with columns named for people and every corrective-gain cell coloured by its sign the way the explorer colours tokens.

The sign convention is the paper's: G = log p(failed action | without the record) - log p(failed action | with it).
G > 0: the record corrected the model (the failed action became less likely). G < 0: backfire (it became more likely).
"""

from __future__ import annotations

import html
from typing import Any

# One colour per sign of G, shared by the table cells, the explorer's tokens and the legend.
BACKFIRE_RGB = (231, 76, 60)  # red: G < 0
CORRECTED_RGB = (52, 152, 219)  # blue: G > 0
CELL_ALPHA = 0.3

# Statistics that are a corrective gain (or a difference of two), so their sign is G's sign.
_GAIN_PREFIXES = ("gain", "delta_gain")
# Labels of statistics report.md does not name (its CONDITION_COLUMNS names the main ones).
_MORE_LABELS = {
    "gain_correct": "G of the correct action (nats)",
    "gain_correct_per_token": "G / token of the correct action (nats)",
    "delta_gain": "G failed - G correct (nats)",
    "delta_gain_per_token": "G failed - G correct, / token (nats)",
    "share_delta_negative": "share (G failed - G correct) < 0",
    "gain_per_token_shared": "G / token, tokens shared with the correct action",
    "gain_per_token_edited": "G / token, tokens the mutation edited",
}


def rgba(rgb: tuple[int, int, int], alpha: float) -> str:
    return f"rgba({rgb[0]}, {rgb[1]}, {rgb[2]}, {alpha})"


def is_gain(stat: str) -> bool:
    return stat.startswith(_GAIN_PREFIXES) and not stat.startswith("gain_correct")


def label(stat: str) -> str:
    """A person's name for a summary statistic; an unknown key is spelled out rather than shown raw."""
    from fastscore.study.report.document import CONDITION_COLUMNS

    known = dict(CONDITION_COLUMNS) | _MORE_LABELS
    if stat in known:
        return known[stat]
    text = stat.replace("_per_token", " / token").replace("_", " ")
    return "G" + text[4:] if text.startswith("gain") else text


def sign_style(stat: str, mean: float | None) -> str:
    """The inline style (and class) a cell of `stat` gets: G's colour for gain statistics, nothing otherwise."""
    if mean is None or not is_gain(stat) or mean == 0:
        return ""
    kind, rgb = ("backfire", BACKFIRE_RGB) if mean < 0 else ("corrected", CORRECTED_RGB)
    return f" class='{kind}' style='background: {rgba(rgb, CELL_ALPHA)}'"


def legend() -> str:
    return (f"<p class='legend' id='legend'>Colour of G: "
            f"<span class='backfire' style='background: {rgba(BACKFIRE_RGB, CELL_ALPHA)}'>red: backfire, G &lt; 0 "
            f"(the record made the failed action more likely)</span> "
            f"<span class='corrected' style='background: {rgba(CORRECTED_RGB, CELL_ALPHA)}'>blue: corrected, G &gt; 0 "
            f"(less likely)</span>; deeper colour, larger |G|.</p>")


def _envs(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {env: block for env, block in summary.items()
            if isinstance(block, dict) and isinstance(block.get("conditions"), dict)}


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}"


def _estimate(value: Any) -> str:
    if not isinstance(value, dict) or value.get("mean") is None:
        return "-"
    return f"{value['mean']:.3g} [{_num(value.get('lo'))}, {_num(value.get('hi'))}]"


def opening(summary: dict[str, Any]) -> str:
    """n per environment, the definitions, the headline G with its interval, and how the intervals were made."""
    envs = _envs(summary)
    if not envs:
        return "<p>No summary (summary.json has no environment with conditions).</p>"
    rows = []
    for env, block in envs.items():
        after = block["conditions"].get("after") or {}
        before = block["conditions"].get("before") or {}
        g = after.get("gain") if isinstance(after.get("gain"), dict) else {}
        rows.append(f"<tr><th>{html.escape(env)}</th><td>{block.get('n_items', '-')}</td>"
                    f"<td{sign_style('gain', g.get('mean'))}>{_estimate(g)}</td>"
                    f"<td{sign_style('gain_per_token', (after.get('gain_per_token') or {}).get('mean'))}>"
                    f"{_estimate(after.get('gain_per_token'))}</td>"
                    f"<td>{_estimate(after.get('share_negative'))}</td>"
                    f"<td>{_estimate(before.get('p_repeat'))} &rarr; {_estimate(after.get('p_repeat'))}</td></tr>")
    boot = next((b["bootstrap"] for b in envs.values() if isinstance(b.get("bootstrap"), dict)), {})
    how = (f"{boot.get('level', 0.95):.0%} intervals: {boot.get('method', 'bootstrap')}, {boot.get('n_boot', '?')} "
           "resamples; shares use the Wilson score interval.") if boot else "Intervals as summary.json gives them."
    return (
        "<p><b>Corrective gain</b> of a failure record: <b>G</b> = log p(failed action | context without the record) "
        "&minus; log p(failed action | context with it), summed over the action's tokens (<b>G / token</b>: divided "
        "by their number). <b>G &gt; 0</b>: the record corrected the model; <b>G &lt; 0</b>: backfire, the record "
        "made repeating the failed action more likely. <b>P(repeat)</b>: the failed action's share of the "
        "probability over a fixed candidate set. <b>n</b>: items (failed actions) per environment.</p>"
        f"{legend()}"
        "<table class='headline'><tr><th>environment</th><th>n</th><th>G total (nats), after a failure record</th>"
        "<th>G / token (nats)</th><th>share of items with G &lt; 0</th><th>P(repeat): before &rarr; after</th></tr>"
        f"{''.join(rows)}</table><p>Each cell: mean [{html.escape(how)}]</p>")


def condition_tables(summary: dict[str, Any]) -> str:
    """One table per environment: a row per condition, a column per statistic, each 'mean [low, high]'."""
    parts = []
    for env, block in _envs(summary).items():
        conditions = block["conditions"]
        stats = list(dict.fromkeys(name for cond in conditions.values() if isinstance(cond, dict)
                                   for name, value in cond.items()
                                   if isinstance(value, dict) and {"mean", "lo", "hi"} <= set(value)))
        head = "".join(f"<th title='{html.escape(s)}'>{html.escape(label(s))}</th>" for s in stats)
        rows = []
        for cond, values in conditions.items():
            cells = []
            for name in stats:
                value = values.get(name) if isinstance(values, dict) else None
                mean = value.get("mean") if isinstance(value, dict) else None
                cells.append("<td>-</td>" if mean is None else
                             f"<td{sign_style(name, mean)} data-stat='{html.escape(name)}'>{mean:.3g} "
                             f"<small>[{_num(value.get('lo'))}, {_num(value.get('hi'))}]</small></td>")
            rows.append(f"<tr><th>{html.escape(cond)}</th>{''.join(cells)}</tr>")
        n = block.get("n_items")
        parts.append(f"<h3>{html.escape(env)}{'' if n is None else f' (n = {n} items)'}</h3>"
                     f"<table class='summary' data-env='{html.escape(env)}'>"
                     f"<tr><th>condition</th>{head}</tr>{''.join(rows)}</table>")
    return "\n".join(parts) or "<p>No summary tables (summary.json has no environment with conditions).</p>"
