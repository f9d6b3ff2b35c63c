"""bench/lab/study_side_by_side.py on crafted run folders: figures read from each run, medians over rounds, and the row
comparison that says whether two versions' runs agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastscore.bench.lab.study_side_by_side import compare_runs, median_figures, render, run_figures

REPORT = """# Study

## Stage timings

| stage | seconds | tokens computed | tok/s |
|---|---|---|---|
| load model | 2.0 |  |  |
| score candidate sets | {score} | 1000 | 10 |
| greedy decoding | {greedy} | {greedy_tokens} | 10 |
| **total** | 99 |  |  |
"""


def write_run(out: Path, score: float, greedy: float, greedy_tokens: int = 500, lp: float = -1.5,
              text: str = "print(1)") -> Path:
    """A `--failures both` run folder with two items per source and the given stage seconds and rows."""
    for source in ("seeded", "model"):
        folder = out / source
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"failures": source, "envs": ["tools", "mbpp"]}))
        (folder / "summary.json").write_text(json.dumps({"tools": {"n_items": 1}, "mbpp": {"n_items": 1}}))
        (folder / "report.md").write_text(REPORT.format(score=score, greedy=greedy, greedy_tokens=greedy_tokens))
        rows = [{"item_id": f"{source}-{k}", "lp": lp + k, "greedy": text, "greedy_repeat": False} for k in range(2)]
        (folder / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_figures_of_a_run_and_medians_over_rounds(tmp_path):
    runs = [run_figures(write_run(tmp_path / f"r{k}", 10.0 + k, 20.0 + 2 * k), wall=36.0 + k) for k in range(3)]
    assert runs[0]["item_runs"] == 4 and runs[0]["item_runs_per_hour"] == pytest.approx(400.0)
    assert runs[0]["stages"]["seeded: greedy decoding"] == {"seconds": 20.0, "tokens": 500}
    median = median_figures(runs)
    assert median["wall_seconds"] == 37.0
    assert median["stages"]["model: score candidate sets"] == {"seconds": 11.0, "tokens": 1000}
    assert median["stages"]["seeded: greedy decoding"]["seconds"] == 22.0
    assert median["tokens_vary_between_rounds"] == []
    other = run_figures(write_run(tmp_path / "other", 10.0, 20.0, greedy_tokens=600), wall=36.0)
    assert median_figures([runs[0], other])["tokens_vary_between_rounds"] == ["seeded: greedy decoding",
                                                                             "model: greedy decoding"]


def test_rows_agree_within_the_tolerance_and_any_other_difference_is_named(tmp_path):
    base = write_run(tmp_path / "base", 10.0, 20.0)
    close = compare_runs(write_run(tmp_path / "close", 9.0, 10.0, lp=-1.5 + 3e-5), base)
    assert close["passed"] and close["max_abs"]["scores:lp"] == pytest.approx(3e-5)
    assert close["n_values"]["scores:lp"] == 4
    far = compare_runs(write_run(tmp_path / "far", 9.0, 10.0, lp=-1.5 + 2e-4), base)
    assert not far["passed"]
    text = compare_runs(write_run(tmp_path / "text", 9.0, 10.0, text="print(2)"), base)
    assert not text["passed"] and len(text["mismatches"]) == 4
    assert any(m.startswith("seeded/scores[0].greedy") for m in text["mismatches"])


def test_the_printed_table_sets_the_versions_side_by_side(tmp_path):
    base = [run_figures(write_run(tmp_path / "base", 10.0, 40.0), wall=72.0)]
    new = [run_figures(write_run(tmp_path / "new", 10.0, 20.0, greedy_tokens=400), wall=36.0)]
    result = {"date_utc": "now", "base": "A", "new": "B", "study_args": ["--limit", "1"], "rounds": 1,
              "median": {"base": median_figures(base), "new": median_figures(new)},
              "speedup_item_runs_per_hour": 2.0,
              "speedup_per_stage": {"seeded: greedy decoding": 2.0}, "load_average_at_start": [0.0],
              "load_average_at_end": [0.0],
              "rows": [compare_runs(tmp_path / "new", tmp_path / "base")]}
    text = render(result)
    print(text)
    assert "seeded: greedy decoding" in text and "2.00" in text and "rows agree" in text


def test_a_folder_given_as_code_is_named_by_its_commit_and_whether_it_is_dirty(tmp_path):
    import subprocess

    from fastscore.bench.lab.study_side_by_side import code_tree

    tree = tmp_path / "checkout"
    (tree / "fastscore").mkdir(parents=True)
    (tree / "fastscore" / "x.py").write_text("A = 1\n")
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    scratch = tmp_path / "scratch"
    assert code_tree(str(tree), scratch, tree) == (tree, {"commit": head, "dirty": False})
    (tree / "notes.txt").write_text("results beside the code do not make it dirty\n")
    assert code_tree(str(tree), scratch, tree)[1]["dirty"] is False
    (tree / "fastscore" / "x.py").write_text("A = 2\n")
    assert code_tree(str(tree), scratch, tree)[1] == {"commit": head, "dirty": True}
    # a commit is unpacked, clean, into the scratch folder
    unpacked, version = code_tree(head, scratch, tree)
    assert unpacked == scratch / f"code-{head[:12]}" and version == {"commit": head[:12], "dirty": False}
    assert (unpacked / "fastscore" / "x.py").read_text() == "A = 1\n"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert code_tree(str(plain), scratch, tree)[1] == {"commit": None, "dirty": None}

    figures = [run_figures(write_run(tmp_path / "run", 10.0, 40.0), wall=72.0)]
    result = {"date_utc": "now", "base": "907a12e", "new": ".", "study_args": [], "rounds": 1,
              "code": {"base": {"commit": "907a12e3a61e", "dirty": False},
                       "new": code_tree(str(tree), scratch, tree)[1]},
              "median": {"base": median_figures(figures), "new": median_figures(figures)},
              "speedup_item_runs_per_hour": 1.0, "speedup_per_stage": {}, "load_average_at_start": [0.0],
              "load_average_at_end": [0.0], "rows": [compare_runs(tmp_path / "run", tmp_path / "run")]}
    header = render(result).splitlines()[0]
    assert header.startswith(f"study side by side — now — base 907a12e (907a12e3a61e) vs new . ({head[:12]}, dirty)")


def test_each_version_imports_its_own_tree_even_from_inside_another_checkout(tmp_path, monkeypatch):
    """`python -c` puts the working directory first on sys.path: run from a checkout, every version imported that
    checkout's fastscore. The child runs with -P, and run_study refuses a tree whose package would not be imported."""
    from fastscore.bench.lab.study_side_by_side import imported_from, run_study

    other = tmp_path / "other-version"
    (other / "fastscore").mkdir(parents=True)
    (other / "fastscore" / "__init__.py").write_text("")
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # a checkout of fastscore: its package sits in the working directory
    assert imported_from(other) == (other / "fastscore").resolve()
    assert imported_from(repo) == (repo / "fastscore").resolve()

    empty = tmp_path / "no-package"
    empty.mkdir()
    with pytest.raises(RuntimeError, match="would import fastscore from"):
        run_study(empty, ["--limit", "1"], tmp_path / "out")


def test_a_versions_libraries_come_after_its_code_and_before_the_venvs(tmp_path):
    """--base-libs / --new-libs: a folder of libraries (e.g. another llama-cpp-python build) shadows the venv's for
    that version only, and each run names the llama_cpp it imported."""
    from fastscore.bench.lab.study_side_by_side import imported_from, llama_cpp_imported

    code = tmp_path / "code"
    (code / "fastscore").mkdir(parents=True)
    (code / "fastscore" / "__init__.py").write_text("")
    libs = tmp_path / "libs"
    (libs / "llama_cpp").mkdir(parents=True)
    (libs / "llama_cpp" / "__init__.py").write_text('__version__ = "0.0.1+other"\n')
    (libs / "fastscore").mkdir()  # a library folder never wins over the version's own code
    (libs / "fastscore" / "__init__.py").write_text("")
    assert imported_from(code, libs) == (code / "fastscore").resolve()
    assert llama_cpp_imported(code, libs) == {"version": "0.0.1+other", "folder": str(libs / "llama_cpp")}
    assert llama_cpp_imported(code) != llama_cpp_imported(code, libs)
