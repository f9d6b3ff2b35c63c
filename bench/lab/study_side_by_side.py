"""The same study workload on two versions of fastscore, interleaved in one run: item-runs per hour, seconds and
tokens computed per stage for each, their ratios, and whether the two versions' rows agree.

Each version is a code tree (a folder, or a commit of this repository unpacked into the scratch folder with
`git archive`) imported through PYTHONPATH by the same interpreter (with `-P`, so the working directory's checkout
does not come first; each run checks the package it imports), so both run on the same venv, machine and load.
`--base-libs` / `--new-libs` put a folder of libraries after a version's code on its import path (e.g. the stock
llama-cpp-python installed with `pip install --target`, so the base runs on the llama.cpp it had); each run records
the llama_cpp it imported.
Rounds alternate the order (A B, B A, ...) so a load that drifts during the run falls on both. Seconds depend on the
load; tokens computed per stage do not, and on a loaded machine the ratios of interleaved runs are the figures to
read. The rows (scores.jsonl, logprobs.jsonl, items.jsonl, skipped.jsonl of each failure source) of every new run are
compared with the base run of the same round by the shard re-scorer's comparator: numbers within
BATCH_INVARIANCE_TOL, everything else equal.

    python -m fastscore.bench.lab.study_side_by_side --base 67fb232 --new . --rounds 2 \\
        --study="--env tools,mbpp --failures both --limit 10 --data ../shared/data --threads 2"
"""

from __future__ import annotations

import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROW_FILES = ("scores", "logprobs", "items", "skipped")  # what a run stores per failure source, compared row by row
PACKAGE_LINKS = ("bench", "conversion", "models")  # fastscore/<name> -> ../<name>, as a worktree has them
SOURCES = ("seeded", "model")


def code_tree(ref: str, scratch: Path, repo: Path) -> tuple[Path, dict[str, Any]]:
    """A folder holding fastscore's code of `ref` (the folder itself if it is one, else the commit unpacked) and the
    version it holds: its commit and dirty flag, so a result names the code even when `ref` is a folder such as `.`."""
    if Path(ref).is_dir():
        from fastscore.study.shards.manifest import git_version

        return Path(ref).resolve(), git_version(Path(ref).resolve())
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", ref], check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = scratch / f"code-{sha}"
    if not tree.is_dir():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(repo), "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for name in PACKAGE_LINKS:  # the package maps these top-level folders; a plain tree needs the links
            link = tree / "fastscore" / name
            if not link.exists():
                link.symlink_to(Path("..") / name)
    return tree, {"commit": sha, "dirty": False}


def _child(code: Path, libs: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The interpreter command and environment that import fastscore from `code` (and, before the venv's, the
    libraries in `libs`). `-P`: without it `python -c` puts the working directory first on sys.path, so run from a
    checkout every version imported that checkout's code."""
    path = os.pathsep.join(str(p) for p in (code, libs) if p is not None)
    return [sys.executable, "-P"], {**os.environ, "PYTHONPATH": path}


def imported_from(code: Path, libs: Path | None = None) -> Path:
    """The package folder a child run on `code` imports."""
    prefix, env = _child(code, libs)
    found = subprocess.run([*prefix, "-c", "import fastscore; print(fastscore.__file__)"], env=env, check=True,
                           capture_output=True, text=True).stdout.strip()
    return Path(found).resolve().parent


def llama_cpp_imported(code: Path, libs: Path | None = None) -> dict[str, str] | None:
    """The llama_cpp a child run imports: its version (a patched build carries a local label) and folder."""
    prefix, env = _child(code, libs)
    got = subprocess.run([*prefix, "-c", "import llama_cpp, os; print(llama_cpp.__version__); "
                          "print(os.path.dirname(llama_cpp.__file__))"], env=env, capture_output=True, text=True)
    if got.returncode != 0:
        return None
    version, folder = got.stdout.split("\n")[:2]
    return {"version": version, "folder": folder}


def run_study(code: Path, study_args: Sequence[str], out: Path, libs: Path | None = None) -> float:
    """One `fastscore study` with `code` first on the import path; its wall seconds. Refuses to time a run that
    would import another tree's code."""
    found = imported_from(code, libs)
    if found != (code / "fastscore").resolve():
        raise RuntimeError(f"a run on {code} would import fastscore from {found}")
    prefix, env = _child(code, libs)
    command = [*prefix, "-c", "from fastscore.cli import main; main()", "study", *study_args, "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def source_folders(out: Path) -> dict[str, Path]:
    """Each failure source's folder of a run (`--failures both` writes one subfolder per source)."""
    subs = {s: out / s for s in SOURCES if (out / s / "summary.json").is_file()}
    if subs:
        return subs
    import json

    return {json.loads((out / "config.json").read_text())["failures"]: out}


def run_figures(out: Path, wall: float) -> dict[str, Any]:
    """Items, wall seconds and per source and stage (seconds, tokens computed) of one finished run."""
    from fastscore.bench.projection import study_work

    works = {source: study_work(folder) for source, folder in source_folders(out).items()}
    items = sum(sum(w["items"].values()) for w in works.values())
    stages = {f"{source}: {stage}": {"seconds": seconds, "tokens": tokens}
              for source, w in works.items() for stage, (seconds, tokens) in w["stages"].items()}
    return {"folder": str(out), "item_runs": items, "wall_seconds": wall,
            "item_runs_per_hour": 3600.0 * items / wall if wall > 0 else None, "stages": stages}


def compare_runs(new: Path, base: Path) -> dict[str, Any]:
    """Every stored row of `new` against `base`: max |Δ| per score kind and every other difference."""
    from fastscore.study.shards.rescore import Comparison, compare
    from fastscore.jsonl import read_jsonl

    out = Comparison()
    new_sources, base_sources = source_folders(new), source_folders(base)
    if set(new_sources) != set(base_sources):
        out.mismatches.append(f"failure sources {sorted(new_sources)} vs {sorted(base_sources)}")
    for source in sorted(set(new_sources) & set(base_sources)):
        for kind in ROW_FILES:
            a, b = new_sources[source] / f"{kind}.jsonl", base_sources[source] / f"{kind}.jsonl"
            got = read_jsonl(a) if a.is_file() else []
            want = read_jsonl(b) if b.is_file() else []
            compare(kind, kind, got, want, f"{source}/{kind}", out)
    return out.to_dict() | {"n_values": out.n_values}


def median_figures(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of wall seconds, item-runs/h and each stage's seconds; tokens of the first run (tokens
    computed do not depend on the load: a difference between rounds is reported as such)."""
    stages = list(dict.fromkeys(s for r in runs for s in r["stages"]))
    tokens_vary = [s for s in stages if len({r["stages"].get(s, {}).get("tokens") for r in runs}) > 1]
    return {"item_runs": runs[0]["item_runs"], "wall_seconds": statistics.median(r["wall_seconds"] for r in runs),
            "item_runs_per_hour": statistics.median(r["item_runs_per_hour"] for r in runs),
            "stages": {s: {"seconds": statistics.median(r["stages"][s]["seconds"] for r in runs if s in r["stages"]),
                           "tokens": runs[0]["stages"].get(s, {}).get("tokens")} for s in stages},
            "tokens_vary_between_rounds": tokens_vary}


def side_by_side(base: str, new: str, study_args: Sequence[str], rounds: int, scratch: Path, repo: Path,
                 keep: bool = False, libs: dict[str, Path | None] | None = None) -> dict[str, Any]:
    (base_tree, base_code), (new_tree, new_code) = code_tree(base, scratch, repo), code_tree(new, scratch, repo)
    trees, code = {"base": base_tree, "new": new_tree}, {"base": base_code, "new": new_code}
    libs = {"base": None, "new": None} | (libs or {})
    llama_cpp = {side: llama_cpp_imported(trees[side], libs[side]) for side in trees}
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    comparisons = []
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    for r in range(rounds):
        order = ("base", "new") if r % 2 == 0 else ("new", "base")
        outs = {}
        for side in order:
            outs[side] = scratch / f"round{r}-{side}"
            wall = run_study(trees[side], study_args, outs[side], libs[side])
            runs[side].append(run_figures(outs[side], wall))
        comparisons.append(compare_runs(outs["new"], outs["base"]))
    medians = {side: median_figures(rs) for side, rs in runs.items()}
    ratio = lambda a, b: a / b if a and b else None  # noqa: E731
    stage_ratio = {s: ratio(medians["base"]["stages"][s]["seconds"], v["seconds"])
                   for s, v in medians["new"]["stages"].items() if s in medians["base"]["stages"]}
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "base": base, "new": new, "trees": {k: str(v) for k, v in trees.items()},
            "code": code, "llama_cpp": llama_cpp, "study_args": list(study_args),
            "rounds": rounds, "runs": runs, "median": medians,
            "speedup_item_runs_per_hour": ratio(medians["new"]["item_runs_per_hour"],
                                                medians["base"]["item_runs_per_hour"]),
            "speedup_per_stage": stage_ratio, "rows": comparisons,
            "load_average_at_start": load_at_start, "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "scratch": str(scratch) if keep else None}


def render(result: dict[str, Any]) -> str:
    from fastscore.bench.table import _f, _grid

    base, new = result["median"]["base"], result["median"]["new"]
    def named(side: str) -> str:
        code = result.get("code", {}).get(side) or {}
        commit = (code.get("commit") or "")[:12]
        return f"{result[side]} ({commit}{', dirty' if code.get('dirty') else ''})" if commit else result[side]

    parts = [f"study side by side — {result['date_utc']} — base {named('base')} vs new {named('new')}; "
             f"fastscore study {' '.join(result['study_args'])}; {result['rounds']} interleaved round(s), medians; "
             f"load average {result['load_average_at_start']} -> {result['load_average_at_end']}"]
    imported = result.get("llama_cpp") or {}
    if any(imported.values()):
        parts.append("llama_cpp: " + "; ".join(f"{side} {v['version']} from {v['folder']}" if v else f"{side} none"
                                               for side, v in imported.items()))
    parts.append("")
    rows = [[stage, _f(base["stages"].get(stage, {}).get("seconds")), _f(v["seconds"]),
             _f(result["speedup_per_stage"].get(stage), 2), str(base["stages"].get(stage, {}).get("tokens")),
             str(v["tokens"])] for stage, v in new["stages"].items()]
    rows.append(["item-runs per hour", _f(base["item_runs_per_hour"]), _f(new["item_runs_per_hour"]),
                 _f(result["speedup_item_runs_per_hour"], 2), str(base["item_runs"]), str(new["item_runs"])])
    parts.append(_grid(["stage", "base s", "new s", "base / new", "base tokens", "new tokens"], rows))
    for side in ("base", "new"):
        if result["median"][side]["tokens_vary_between_rounds"]:
            parts.append(f"{side}: tokens computed differ between rounds in "
                         f"{', '.join(result['median'][side]['tokens_vary_between_rounds'])}")
    parts.append("")
    for r, rows_cmp in enumerate(result["rows"]):
        worst = max(rows_cmp["max_abs"].values(), default=0.0)
        verdict = "agree" if rows_cmp["passed"] else "DIFFER"
        parts.append(f"round {r}: rows {verdict}: max |Δ| {worst:.3g} over "
                     f"{sum(rows_cmp['n_values'].values()):,} numbers (tolerance {rows_cmp['tolerance']:g}), "
                     f"{len(rows_cmp['mismatches'])} other differences")
        parts += [f"  differs: {m}" for m in rows_cmp["mismatches"][:10]]
    return "\n".join(parts)


def _main() -> None:
    import shlex

    import click

    from fastscore.bench.table import print_and_save

    @click.command()
    @click.option("--base", required=True, help="Code of the baseline: a folder or a commit of --repo.")
    @click.option("--new", "new", required=True, help="Code measured against it: a folder or a commit of --repo.")
    @click.option("--study", "study", required=True, help="The `fastscore study` arguments both versions run, quoted.")
    @click.option("--rounds", default=2, show_default=True, type=click.IntRange(min=1))
    @click.option("--repo", default=".", show_default=True, type=click.Path(file_okay=False, path_type=Path))
    @click.option("--scratch", default=None, type=click.Path(file_okay=False, path_type=Path),
                  help="Folder for the code trees and run folders (kept); default a temporary folder (removed).")
    @click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path))
    @click.option("--base-libs", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
                  help="Libraries the base imports before the venv's (a `pip install --target` folder).")
    @click.option("--new-libs", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
                  help="Libraries the new version imports before the venv's.")
    def command(base, new, study, rounds, repo, scratch, json_out, base_libs, new_libs):
        """Run `fastscore study STUDY` with two code versions, interleaved, and compare speed and rows."""
        study_args = shlex.split(study)
        libs = {"base": base_libs.resolve() if base_libs else None, "new": new_libs.resolve() if new_libs else None}
        if "--out" in study_args:
            raise click.UsageError("--study must not set --out: each run gets its own folder in --scratch")
        if scratch is not None:
            scratch.mkdir(parents=True, exist_ok=True)
            result = side_by_side(base, new, study_args, rounds, scratch.resolve(), repo, keep=True, libs=libs)
        else:
            with tempfile.TemporaryDirectory(prefix="fastscore-side-by-side-") as tmp:
                result = side_by_side(base, new, study_args, rounds, Path(tmp), repo, libs=libs)
        print_and_save(result, json_out, render)

    command()


if __name__ == "__main__":
    _main()
