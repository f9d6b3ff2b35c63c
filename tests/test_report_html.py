"""report.html: built from a study folder's files, self-contained, and rendered in a real headless chromium (the
explorer shows an item's tokens and switches to another item; G's sign has one colour, named in the legend)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import asdict

import pytest

from fastscore.selection import ModelSelection
from fastscore.study.data.envs import items_for_envs, open_envs
from fastscore.study.report.html import TOKENS_FILE, build_report_html, write_token_changes
from fastscore.study.report.html_summary import BACKFIRE_RGB, CORRECTED_RGB

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SUMMARY = {"tools": {"n_items": 3, "conditions": {
    "before": {"p_repeat": {"mean": 0.02, "lo": 0.0, "hi": 0.05, "n": 3}},
    "description": {"gain": {"mean": 4.2, "lo": 1.0, "hi": 7.5, "n": 3}},
    "after": {"gain": {"mean": -32.1, "lo": -36.8, "hi": -27.4, "n": 3}, "p_repeat": {"mean": 0.76, "lo": 0.6,
                                                                                        "hi": 0.9, "n": 3}}},
    "bootstrap": {"n_boot": 10}}}


@pytest.fixture(scope="module")
def study_folder(tmp_path_factory, study_data, smollm_artefact):
    pytest.importorskip("llama_cpp")
    smollm_artefact("llamacpp", "q4_1")
    folder = tmp_path_factory.mktemp("study")
    items, _ = items_for_envs(open_envs(["tools"], study_data), 3, 0)
    (folder / "items.jsonl").write_text("".join(json.dumps(asdict(item)) + "\n" for item in items))
    (folder / "config.json").write_text(json.dumps({"model": "smollm2-135m-instruct", "backend": "llamacpp",
                                                    "quant": "q4_1", "envs": ["tools"], "data_dir": str(study_data),
                                                    "hf_path": None}))
    (folder / "summary.json").write_text(json.dumps(SUMMARY))
    with ModelSelection.resolve("smollm2-135m-instruct", "llamacpp", "q4_1", threads=2).open() as scorer:
        write_token_changes(folder, scorer)
    return folder, items


def test_token_changes_cover_the_failed_action_token_by_token(study_folder):
    folder, items = study_folder
    lines = [json.loads(t) for t in (folder / TOKENS_FILE).read_text().splitlines()]
    assert [line["item_id"] for line in lines] == [item.item_id for item in items]
    for line, item in zip(lines, items, strict=True):
        assert len(line["token_texts"]) == len(line["before"]) == len(line["after"])
        assert "".join(line["token_texts"][:-1]) == item.failed_action and line["token_texts"][-1] == "<|im_end|>"
        assert line["before"] != line["after"]  # the failure record changes the action's log-probs


def test_report_html_is_self_contained_with_tables_and_explorer_data(study_folder):
    folder, items = study_folder
    page = build_report_html(folder).read_text()
    assert not re.search(r"""(src|href)=["']?https?:""", page)  # nothing fetched from the network
    assert "data-env='tools'" in page and "-32.1" in page and "P(repeat)" in page and "G total (nats)" in page
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", page)
    assert not [h for h in headers if "_" in h], headers  # columns named for people, never raw summary.json keys
    opening = page.split("<h2>By condition</h2>")[0]
    assert "G &gt; 0</b>: the record corrected the model" in opening and "n = 3 items" in page
    assert "[-36.8, -27.4]" in opening and "10 resamples" in opening  # the headline G with its interval
    data = json.loads(re.search(r'<script id="explorer-data" type="application/json">(.*?)</script>', page,
                                re.S).group(1))
    assert [d["id"] for d in data] == [item.item_id for item in items]


def _chromium(*args, profile):
    return subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180)


def test_the_explorer_renders_and_switches_items_in_a_headless_browser(study_folder, tmp_path):
    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (make test installs it: apt-get install chromium)")
    folder, items = study_folder
    page = build_report_html(folder)
    tokens = {json.loads(t)["item_id"]: json.loads(t) for t in (folder / TOKENS_FILE).read_text().splitlines()}
    for k, item in ((0, items[0]), (2, items[2])):
        url = page.as_uri() + ("" if k == 0 else f"#item={item.item_id}")
        dom = _chromium("--dump-dom", url, profile=tmp_path / f"profile{k}").stdout
        assert f'data-shown-item="{item.item_id}"' in dom, dom[-2000:]
        spans = re.findall(r'<span class="tok" data-g="(-?[0-9.]+)"[^>]*? style="background: rgba?\((\d+), (\d+), (\d+)',
                           dom)
        expected = [b - a for a, b in zip(tokens[item.item_id]["after"], tokens[item.item_id]["before"])]
        assert [float(s[0]) for s in spans] == pytest.approx(expected, abs=1e-4)
        # a token's colour is its G's: backfire (G < 0) red, corrected blue, as the legend says
        colours = [tuple(map(int, s[1:])) for s in spans]
        assert colours == [BACKFIRE_RGB if g < 0 else CORRECTED_RGB for g in expected]
        assert BACKFIRE_RGB in colours
        assert "G of the action" in dom
        _check_legend_and_the_backfire_cell(dom)
    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri() + f"#item={items[1].item_id}",
              profile=tmp_path / "profile-shot")
    assert shot.is_file() and shot.stat().st_size > 10_000
    print("screenshot:", shot)


def _check_legend_and_the_backfire_cell(dom: str) -> None:
    """In the rendered page: the legend names red as backfire, and the G < 0 cell (after: -32.1) is that red."""
    red = "rgba({}, {}, {}".format(*BACKFIRE_RGB)
    legend = re.search(r'<p class="legend" id="legend">(.*?)</p>', dom, re.S).group(1)
    swatch = re.search(r'<span class="backfire" style="background: (rgba\([^)]*\))">([^<]*)</span>', legend)
    assert swatch and swatch.group(1).startswith(red) and "backfire, G &lt; 0" in swatch.group(2), legend
    cell = re.search(r'<td class="backfire" style="background: (rgba\([^)]*\));?" data-stat="gain">-32\.1 ', dom)
    assert cell and cell.group(1) == swatch.group(1), re.findall(r"<td[^>]*>-32\.1", dom)
    positive = re.search(r'<td class="corrected" style="background: rgba\((\d+), (\d+), (\d+)[^"]*" data-stat="gain">',
                         dom)
    assert positive and tuple(map(int, positive.groups())) == CORRECTED_RGB


def test_the_top_level_study_folder_gets_a_page_per_part_and_one_linking_them(study_folder, tmp_path):
    from click.testing import CliRunner

    from fastscore.cli import main

    folder, _ = study_folder
    top = tmp_path / "study-out"
    for part in ("seeded", "model"):
        shutil.copytree(folder, top / part)
    result = CliRunner().invoke(main, ["report-html", str(top)])
    assert result.exit_code == 0, result.output
    assert all(f"wrote {top / part / 'report.html'}" in result.output for part in ("seeded", "model"))
    index = (top / "report.html").read_text()
    assert "href='seeded/report.html'" in index and "href='model/report.html'" in index
    assert index.count("[-36.8, -27.4]") == 2 and "backfire" in index
    assert (top / "seeded" / "report.html").read_text().count("data-env='tools'") == 1
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    refused = CliRunner().invoke(main, ["report-html", str(nothing)])
    assert refused.exit_code == 7 and "not a study folder" in refused.output and "Traceback" not in refused.output


def test_the_cli_writes_report_html_from_an_existing_token_file(study_folder):
    from click.testing import CliRunner

    from fastscore.cli import main

    folder, _ = study_folder
    (folder / "report.html").unlink(missing_ok=True)
    result = CliRunner().invoke(main, ["report-html", str(folder)])
    assert result.exit_code == 0, result.output
    assert (folder / "report.html").is_file() and "report.html" in result.output
