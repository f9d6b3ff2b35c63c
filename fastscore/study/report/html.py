"""report.html: one self-contained page (no network, no external file) beside a study's report.md.

It opens with a summary (n, what G means, the headline G with its interval; html_summary.py), then the
per-condition tables with columns named for people, the study's plots (its PNGs, inlined), and a per-item explorer:
the failed action's tokens coloured by each token's G = log p(before) - log p(after), the same colours as the tables
(red: G < 0, backfire, the token became more likely after the failure record; blue: G > 0) — so one sees whether the
inversion sits in the tokens the mutation edited or in the ones copied from the correct call.

On a `--failures both` study's top folder (its seeded/ and model/ subfolders are each a study folder) it writes each
part's own page and a top page that links them, each with its headline summary.

It reads the study's output files only, and few of their keys (the contract with fastscore/study/, kept small):
- summary.json: for each top-level key whose value has a "conditions" mapping (an environment), every
  condition's statistics that are {"mean", "lo", "hi"} records; the rest is ignored, so metrics may be added or
  renamed without touching this module.
- items.jsonl: "item_id", "env", "task", "failed_action", "error_message", "failure_kind".
- config.json: "model", "backend", "quant", "envs", "data_dir", "hf_path" (for the token step below).
- *.png in the folder: the plots, in file-name order.
- tokens.jsonl, written by `write_token_changes` (the one step that needs the model): per item the failed action's
  token pieces and their log-probs under `before` and `after`, scored by fastscore as the study scores them.
"""

from __future__ import annotations

import base64
import html
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastscore.errors import DataError
from fastscore.jsonl import read_jsonl
from fastscore.outputs import write_text_atomic
from fastscore.study.report import html_summary as summary_html

log = logging.getLogger(__name__)

TOKENS_FILE = "tokens.jsonl"
HTML_FILE = "report.html"
CONDITIONS = ("before", "after")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return read_jsonl(path)


def write_token_changes(out_dir: Path, scorer, items: Sequence[dict[str, Any]] | None = None) -> Path:
    """Score each item's failed action under `before` and `after` token by token; write tokens.jsonl."""
    from fastscore.records import ScoreRequest
    from fastscore.study.data.conditions import render_conditions
    from fastscore.study.data.envs import open_envs
    from fastscore.study.data.items import Item

    out_dir = Path(out_dir)
    config = _read_json(out_dir / "config.json")
    raw_items = items if items is not None else _read_jsonl(out_dir / "items.jsonl")
    parsed = [Item.from_json(json.dumps(raw)) for raw in raw_items]
    envs = open_envs(sorted({item.env for item in parsed}), Path(config["data_dir"]))
    requests = []
    for item in parsed:
        for context in render_conditions(item, envs[item.env], CONDITIONS):
            requests.append(ScoreRequest(f"{item.item_id}::{context.condition}", context.messages,
                                         item.failed_action))
    results = iter(scorer.score(requests))
    lines = []
    for item in parsed:
        before, after = next(results), next(results)
        lines.append({"item_id": item.item_id, "env": item.env, "token_texts": list(before.token_texts),
                      "before": list(before.token_logprobs), "after": list(after.token_logprobs)})
    path = out_dir / TOKENS_FILE
    write_text_atomic(path, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return path


PARTS = ("seeded", "model")  # a `--failures both` study's subfolders, each a complete study folder


def study_parts(out_dir: Path) -> list[Path]:
    """The part folders of a top-level study folder ([] for a single study folder, which has its own config.json)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return []
    return [out_dir / part for part in PARTS if (out_dir / part / "summary.json").is_file()]


def write_report_html(out_dir: Path, *, threads: int | None = None, rescore: bool = False) -> Path:
    """report.html for a study folder, or for each part of a top-level one plus a page linking them; tokens.jsonl is
    scored first (with the study's model) if missing or asked."""
    out_dir = Path(out_dir)
    parts = study_parts(out_dir)
    if parts:
        for part in parts:
            write_report_html(part, threads=threads, rescore=rescore)
        return build_index_html(out_dir, parts)
    if not (out_dir / "summary.json").is_file():
        raise DataError(f"{out_dir} is not a study folder: expected summary.json and config.json there, or the "
                        f"subfolders {' and '.join(PARTS)} of a `fastscore study --failures both` run")
    scorable = (out_dir / "config.json").is_file() and (out_dir / "items.jsonl").is_file()
    if not scorable:  # e.g. a sharded run's merged folder: its summary and plots, without the token explorer
        log.warning("%s has no config.json and items.jsonl: report.html without the per-item explorer", out_dir)
    elif rescore or not (out_dir / TOKENS_FILE).is_file():
        from fastscore.selection import ModelSelection

        config = _read_json(out_dir / "config.json")
        selection = ModelSelection.resolve(config["model"], config["backend"], config["quant"],
                                           hf_path=config.get("hf_path"), threads=threads)
        with selection.open(progress=True) as scorer:
            write_token_changes(out_dir, scorer)
    return build_report_html(out_dir)


def _plots(out_dir: Path) -> str:
    figures = []
    for png in sorted(out_dir.glob("*.png")):
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        figures.append(f"<figure><img alt='{html.escape(png.stem)}' src='data:image/png;base64,{data}'>"
                       f"<figcaption>{html.escape(png.name)}</figcaption></figure>")
    return "\n".join(figures) or "<p>No plots in this folder.</p>"


def _explorer_data(items: list[dict[str, Any]], tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_id = {t["item_id"]: t for t in tokens}
    out = []
    for item in items:
        token = by_id.get(item["item_id"])
        if token is None:
            continue
        out.append({"id": item["item_id"], "env": item.get("env", ""), "kind": item.get("failure_kind", ""),
                    "task": item.get("task", ""), "action": item.get("failed_action", ""),
                    "error": item.get("error_message", ""), "tokens": token["token_texts"],
                    "before": token["before"], "after": token["after"]})
    return out


def build_report_html(out_dir: Path) -> Path:
    """Write out_dir/report.html from the study's files (tokens.jsonl for the explorer, if present)."""
    out_dir = Path(out_dir)
    summary = _read_json(out_dir / "summary.json")
    config = _read_json(out_dir / "config.json") if (out_dir / "config.json").is_file() else {}
    explorer = _explorer_data(_read_jsonl(out_dir / "items.jsonl"), _read_jsonl(out_dir / TOKENS_FILE))
    title = (f"fastscore study: {config.get('model', '?')} [{config.get('backend', '?')}, {config.get('quant', '?')}]"
             if config else f"fastscore study: {out_dir.resolve().parent.name}/{out_dir.name}")
    data = json.dumps(explorer, ensure_ascii=False).replace("</", "<\\/")  # no "</script>" inside the script
    page = (_TEMPLATE.replace("%TITLE%", html.escape(title))
            .replace("%OPENING%", summary_html.opening(summary))
            .replace("%TABLES%", summary_html.condition_tables(summary))
            .replace("%BACKFIRE%", ", ".join(map(str, summary_html.BACKFIRE_RGB)))
            .replace("%CORRECTED%", ", ".join(map(str, summary_html.CORRECTED_RGB)))
            .replace("%PLOTS%", _plots(out_dir))
            .replace("%DATA%", data))
    path = out_dir / HTML_FILE
    write_text_atomic(path, page)
    return path


def build_index_html(out_dir: Path, parts: Sequence[Path]) -> Path:
    """The top folder's report.html: each part's headline summary and a link to its own page."""
    sections = []
    for part in parts:
        summary = _read_json(part / "summary.json")
        sections.append(f"<h2 id='part-{html.escape(part.name)}'>{html.escape(part.name)} failures: "
                        f"<a href='{html.escape(part.name)}/{HTML_FILE}'>{html.escape(part.name)}/{HTML_FILE}</a></h2>"
                        f"{summary_html.opening(summary)}")
    page = (_INDEX.replace("%TITLE%", html.escape(f"fastscore study: {out_dir.name}"))
            .replace("%PARTS%", "\n".join(sections)))
    path = out_dir / HTML_FILE
    write_text_atomic(path, page)
    return path


_INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%TITLE%</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; } th:first-child { text-align: left; }
</style></head><body>
<h1>%TITLE%</h1>
<p>The study ran on two sources of failures, each reported on its own page (with its tables, plots and per-item
explorer): seeded failures are mutations of the ground-truth action; model failures are the model's own failed
attempts.</p>
%PARTS%
</body></html>
"""


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%TITLE%</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th:first-child { text-align: left; }
figure { display: inline-block; margin: 0.5em; } figure img { max-width: 560px; }
#tokens { font-family: monospace; white-space: pre-wrap; line-height: 2; font-size: 1.05em; }
.tok { border-radius: 3px; padding: 0.1em 0; outline: 1px solid #eee; }
.legend span { padding: 0 0.5em; } pre { white-space: pre-wrap; background: #f6f6f6; padding: 0.5em; }
</style></head><body>
<h1>%TITLE%</h1>
<h2>Summary</h2>
%OPENING%
<h2>By condition</h2>
<p>Mean [interval] per condition and statistic (hover a column's name for its key in summary.json).</p>
%TABLES%
<h2>Plots</h2>
%PLOTS%
<h2>Per-item explorer</h2>
<p class="legend" id="token-legend">The failed action's tokens, coloured by each token's G = log p(before) &minus;
log p(after): <span class="backfire" style="background: rgb(%BACKFIRE%)">red: backfire, G &lt; 0 (more likely
after the failure record)</span> <span class="corrected" style="background: rgb(%CORRECTED%)">blue: corrected,
G &gt; 0 (less likely)</span> (hover a token for its numbers).</p>
<div id="explorer">
<label>item <select id="item-select"></select></label>
<button id="prev">&larr;</button><button id="next">&rarr;</button>
<h3 id="item-title"></h3>
<p id="item-sum"></p>
<div id="tokens"></div>
<h4>error message</h4><pre id="item-error"></pre>
<h4>task</h4><pre id="item-task"></pre>
</div>
<script id="explorer-data" type="application/json">%DATA%</script>
<script>
const items = JSON.parse(document.getElementById("explorer-data").textContent);
const select = document.getElementById("item-select");
items.forEach((item, k) => { const o = document.createElement("option"); o.value = k;
  o.textContent = item.id + " (" + item.env + ")"; select.appendChild(o); });
function colour(g) {  // G's sign: red for backfire (G < 0), blue for corrected (G > 0), as in the tables
  const a = Math.min(Math.abs(g) / 5, 1);
  return g < 0 ? `rgba(%BACKFIRE%, ${a})` : `rgba(%CORRECTED%, ${a})`;
}
function show(k) {
  if (!items.length) { document.getElementById("item-title").textContent = "no token data (tokens.jsonl)"; return; }
  k = (k + items.length) % items.length; select.value = k;
  const item = items[k], box = document.getElementById("tokens");
  document.getElementById("item-title").textContent = item.id + " \u2014 " + item.env + " \u2014 " + item.kind;
  box.replaceChildren();
  let total = 0;
  item.tokens.forEach((text, i) => {
    const g = item.before[i] - item.after[i]; total += g;
    const span = document.createElement("span");
    span.className = "tok"; span.textContent = text; span.dataset.g = g.toFixed(4);
    span.style.background = colour(g);
    span.title = `log p before ${item.before[i].toFixed(3)}  after ${item.after[i].toFixed(3)}  G ${g.toFixed(3)}`;
    box.appendChild(span);
  });
  document.getElementById("item-sum").textContent =
    `${item.tokens.length} tokens; G of the action (log p(before) \u2212 log p(after), summed): ` +
    `${total.toFixed(2)} nats (${total < 0 ? "backfire" : "corrected"})`;
  document.getElementById("item-error").textContent = item.error;
  document.getElementById("item-task").textContent = item.task;
  document.body.dataset.shownItem = item.id;
}
function fromHash() {
  const id = decodeURIComponent((location.hash.match(/item=([^&]*)/) || [])[1] || "");
  const k = items.findIndex(item => item.id === id);
  show(k >= 0 ? k : 0);
}
select.addEventListener("change", () => show(Number(select.value)));
document.getElementById("prev").addEventListener("click", () => show(Number(select.value) - 1));
document.getElementById("next").addEventListener("click", () => show(Number(select.value) + 1));
window.addEventListener("hashchange", fromHash);
fromHash();
</script>
</body></html>
"""
