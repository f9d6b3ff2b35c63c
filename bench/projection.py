"""From `fastscore bench scale` rates to the projected wall time of the full study grid, and the table of docs/scale.md.

The work of one item-run comes from a real study run's stage table (report.md: seconds and tokens the model computed
per stage) and item counts (summary.json), for each failure source. A stage's tokens are run at the rate the bench
measured for that kind of work on the model and type: scoring stages at the shared-scoring computed tok/s, decoding
stages (greedy, sampled retries, on-policy attempts) at the batched greedy rate counting the contexts' prefill
((prefill + decoded tokens) / (prefill + decode seconds)). Token counts are the SmolLM2 tokenizer's (the stand-ins
carry it) and the on-policy decode lengths are the 135M model's: other models' own tokenizers and attempts change
them. Projections ignore per-item overheads that do not scale with the model (rendering, the MBPP sandbox), which the
135M row's "projected vs measured" ratio shows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from fastscore.bench.scale import step_name
from fastscore.errors import DataError

DECODE_STAGES = ("build items", "greedy decoding")
SCORE_STAGES = ("score candidate sets",)
CONVERSION_LABELS = {"hf-fp32": "HF fp32", "gguf-f32": "GGUF f32", "gguf-f16": "f16", "gguf-q8_0": "q8_0",
                     "gguf-q4_k_m": "q4_k_m", "onnx-fp32": "ONNX fp32", "onnx-int8": "ONNX int8"}


def stage_table(report_md: Path) -> dict[str, tuple[float, int | None]]:
    """{stage: (seconds, tokens computed)} from a study report's "Stage timings" table."""
    text = Path(report_md).read_text(encoding="utf-8")
    section = text.split("## Stage timings", 1)
    if len(section) < 2:
        raise DataError(f"{report_md} has no stage timings")
    out = {}
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"[\d.]+", cells[1]) and not cells[0].startswith("**"):
            out[cells[0]] = (float(cells[1]), int(cells[2]) if cells[2] else None)
    return out


def study_work(folder: Path) -> dict:
    """One study run (a failure source's folder): its stages, items per environment and what it examined."""
    folder = Path(folder)
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    items = {env: int(summary[env]["n_items"]) for env in config["envs"] if env in summary}
    skipped_file = folder / "skipped.jsonl"
    skipped: dict[str, int] = {}
    if skipped_file.is_file():
        for line in skipped_file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                env = json.loads(line).get("env", "?")
                skipped[env] = skipped.get(env, 0) + 1
    return {"folder": str(folder), "failures": config.get("failures"), "model": config.get("model"),
            "quant": config.get("quant"), "items": items, "skipped": skipped, "stages": stage_table(folder / "report.md")}


def count_sources(data_dir: Path, envs: Sequence[str]) -> dict[str, int]:
    """Source records per environment, read with the study's own loaders (seeded items are built from these)."""
    from fastscore.study.data.envs import open_envs

    return {name: len(env.load_sources()) for name, env in open_envs(envs, Path(data_dir)).items()}


def rates(results: dict, backend: str, quant: str) -> dict[str, float] | None:
    """Measured tok/s of one model and type: scoring (computed), pp512, unique, and greedy with prefill."""
    score = results["steps"].get(step_name("score", backend, quant), {})
    greedy = results["steps"].get(step_name("greedy", backend, quant), {})
    if "shared" not in score:
        return None
    shared = score["shared"]
    out = {"score_computed": shared["stats"]["computed_tokens"] / shared["seconds"],
           "unique": score["trie_minimal_tokens"] / shared["seconds"],
           "pp": score["prefill"]["tokens"] / score["prefill"]["seconds"],
           "score_rss": score.get("max_rss_bytes")}
    if "cpu_seconds" in shared:  # per CPU second of the process: what a step's share of a busy core hardly moves
        out["unique_cpu"] = score["trie_minimal_tokens"] / shared["cpu_seconds"]
        out["score_computed_cpu"] = shared["stats"]["computed_tokens"] / shared["cpu_seconds"]
        out["pp_cpu"] = score["prefill"]["tokens"] / score["prefill"]["cpu_seconds"]
        out["score_core_share"] = shared["cpu_seconds"] / shared["seconds"]
    return {**out, **greedy_rates(greedy)}


def greedy_rates(greedy: dict) -> dict[str, float]:
    """A recorded greedy step's tok/s (decode phase, and with the contexts' prefill); empty if it holds none."""
    out = {}
    batches = [v for k, v in greedy.items() if k.isdigit()]
    if batches:
        run = batches[0]["batched"]
        decoded = batches[0]["contexts"] * batches[0]["new_tokens"]
        out["greedy_decode"] = run["tokens_per_s"]
        out["greedy_with_prefill"] = (run["prefill_tokens"] + decoded) / (run["prefill_seconds"] + run["decode_seconds"])
        out["greedy_rss"] = greedy.get("max_rss_bytes")
        if "decode_cpu_seconds" in run:
            out["greedy_decode_cpu"] = decoded / run["decode_cpu_seconds"]
            greedy_cpu = run["prefill_cpu_seconds"] + run["decode_cpu_seconds"]
            out["greedy_with_prefill_cpu"] = (run["prefill_tokens"] + decoded) / greedy_cpu
            out["greedy_core_share"] = greedy_cpu / (run["prefill_seconds"] + run["decode_seconds"])
    return out


def on_basis(rate: dict[str, float] | None, basis: str) -> dict[str, float] | None:
    """The rates a projection runs at: by wall time, or per CPU second of the step ("cpu": a worker that has its
    whole core, for rates measured while other work shared the machine); None where that basis was not recorded."""
    if rate is None or basis == "wall":
        return rate
    if basis != "cpu":
        raise ValueError(f"unknown rate basis {basis!r}: wall or cpu")
    if "score_computed_cpu" not in rate:
        return None
    picked = {"score_computed": rate["score_computed_cpu"]}
    if "greedy_with_prefill_cpu" in rate:
        picked["greedy_with_prefill"] = rate["greedy_with_prefill_cpu"]
    return picked


def project_seconds(work: dict, rate: dict[str, float], scale: float) -> float | None:
    """Seconds of one failure source's full run: each stage's tokens per examined item x `scale` at the rate."""
    total = 0.0
    for stage, (_, tokens) in work["stages"].items():
        if not tokens:
            continue
        if stage in SCORE_STAGES:
            total += tokens / rate["score_computed"]
        elif stage in DECODE_STAGES:
            if "greedy_with_prefill" not in rate:
                return None
            total += tokens / rate["greedy_with_prefill"]
    return total * scale


def full_scale(work: dict, sources: dict[str, int]) -> float:
    """How many times the run's work the full data is: sources in the data / sources the run examined."""
    examined = sum(work["items"].values()) + sum(work["skipped"].values())
    return sum(sources[env] for env in work["items"]) / examined


def fastest_type(results: dict, candidates: Sequence[tuple[str, str]], basis: str = "wall",
                 works: Sequence[dict] = (), sources: dict[str, int] | None = None) -> tuple[str, str] | None:
    """The measured type (scoring and greedy rates both recorded) with the least projected grid time over `works`;
    without study runs, the one with the highest scoring rate. A type can score faster and decode slower than
    another (ONNX vs llama.cpp), so the scoring rate alone does not pick the fastest grid."""
    measured = [(on_basis(rates(results, b, q), basis), (b, q)) for b, q in candidates]
    measured = [(r, bq) for r, bq in measured if r and "greedy_with_prefill" in r]
    if not measured:
        return None
    if works and sources:
        return min(measured, key=lambda m: sum(project_seconds(w, m[0], full_scale(w, sources)) for w in works))[1]
    return max(measured, key=lambda m: m[0]["score_computed"])[1]


def _gb(n: int | None) -> str:
    return "–" if not n else f"{n / 1e9:.2f}"


def _f(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def conversion_rows(all_results: Sequence[dict]) -> list[str]:
    lines = ["| model | variant | wall s | CPU s | peak RSS GB | size GB | read-back check |", "|---|---|---|---|---|---|---|"]
    for res in all_results:
        for variant, name in CONVERSION_LABELS.items():
            step = res["steps"].get(f"convert-{variant}")
            if not step:
                continue
            if "error" in step:
                lines.append(f"| {res['label']} | {name} | failed: {step['error'][:200]} | | | | |")
                continue
            check = step.get("check") or ""
            verdict = ("PASS" if step.get("check_passed") else "FAIL") + check[check.find(": max|d|"):check.find(" nats")] \
                if check else "structure only (the stand-in is its own reference)"
            verdict = verdict.replace("|", "\\|")  # "max|d|" inside a markdown cell
            lines.append(f"| {res['label']} | {name} | {step['wall_seconds']:.0f} | {step.get('cpu_seconds', 0):.0f} | "
                         f"{_gb(step.get('max_rss_bytes'))} | {_gb(step.get('bytes'))} | {verdict} |")
    return lines


def scoring_rows(all_results: Sequence[dict], configs: Sequence[tuple[str, str]]) -> list[str]:
    lines = ["| model | type | pp512 tok/s | shared scoring: unique tok/s (computed) | batched greedy decode tok/s "
             "(with prefill) | peak RSS scoring / greedy GB | unique tok/s per CPU s (core share) | greedy with prefill "
             "tok/s per CPU s (core share) |", "|---|---|---|---|---|---|---|---|"]
    for res in all_results:
        for backend, quant in configs:
            r = rates(res, backend, quant)
            if r is None:
                step = res["steps"].get(step_name("score", backend, quant), {})
                greedy = greedy_rates(res["steps"].get(step_name("greedy", backend, quant), {}))
                if "error" in step:
                    lines.append(f"| {res['label']} | {backend} {quant} | failed: {step['error'][:160]} | | | | | |")
                elif greedy:  # a greedy step measured without its scoring step: its row, scoring cells empty
                    lines.append(f"| {res['label']} | {backend} {quant} | – | – | {_f(greedy['greedy_decode'], 1)} "
                                 f"({_f(greedy['greedy_with_prefill'], 1)}) | – / {_gb(greedy.get('greedy_rss'))} | – | "
                                 f"{_f(greedy.get('greedy_with_prefill_cpu'), 1)} "
                                 f"({_f(greedy.get('greedy_core_share'), 2)}) |")
                continue  # not measured: no row (the conversion table shows what exists)
            greedy = (f"{_f(r.get('greedy_decode'), 1)} ({_f(r.get('greedy_with_prefill'), 1)})"
                      if "greedy_decode" in r else "–")
            lines.append(f"| {res['label']} | {backend} {quant} | {_f(r['pp'], 1)} | {_f(r['unique'], 1)} "
                         f"({_f(r['score_computed'], 1)}) | {greedy} | {_gb(r['score_rss'])} / {_gb(r.get('greedy_rss'))} | "
                         f"{_f(r.get('unique_cpu'), 1)} ({_f(r.get('score_core_share'), 2)}) | "
                         f"{_f(r.get('greedy_with_prefill_cpu'), 1)} ({_f(r.get('greedy_core_share'), 2)}) |")
    return lines


def ratio_rows(all_results: Sequence[dict], configs: Sequence[tuple[str, str]]) -> list[str]:
    """Each measured type's rates over the same model's llama.cpp f32 rates from the same results folder: by wall
    time, and (in brackets, where recorded) by the process's CPU time, which the share of a core a step got on a busy
    machine hardly moves; with that share during the two scoring runs (CPU s / wall s) and the load before them."""
    lines = ["| model | type | pp512 / f32 | shared scoring unique tok/s / f32 | greedy decode / f32 | greedy with "
             "prefill / f32 | core share while scoring: type / f32 | load (1 min) before scoring: type / f32 |",
             "|---|---|---|---|---|---|---|---|"]

    def ratio(r: dict, base: dict, key: str) -> str:
        a, b = r.get(key), base.get(key)
        wall = _f(a / b, 2) if a is not None and b else "–"
        a, b = r.get(f"{key}_cpu"), base.get(f"{key}_cpu")
        return wall + (f" ({a / b:.2f})" if a is not None and b else "")

    for res in all_results:
        base = rates(res, "llamacpp", "f32")
        if base is None:
            continue
        base_load = res["steps"][step_name("score", "llamacpp", "f32")].get("load_average_before", [None])[0]
        for backend, quant in configs:
            r = rates(res, backend, quant)
            if r is None or (backend, quant) == ("llamacpp", "f32"):
                continue
            load = res["steps"][step_name("score", backend, quant)].get("load_average_before", [None])[0]
            lines.append(f"| {res['label']} | {backend} {quant} | {ratio(r, base, 'pp')} | {ratio(r, base, 'unique')} | "
                         f"{ratio(r, base, 'greedy_decode')} | {ratio(r, base, 'greedy_with_prefill')} | "
                         f"{_f(r.get('score_core_share'), 2)} / {_f(base.get('score_core_share'), 2)} | "
                         f"{_f(load, 2)} / {_f(base_load, 2)} |")
    return lines


def projected_grid(all_results: Sequence[dict], works: Sequence[dict], sources: dict[str, int],
                   fast_candidates: Sequence[tuple[str, str]], workers: int,
                   factors: dict[str, float] | None = None, basis: str = "wall") -> list[dict]:
    """Per model, its exact default and its fastest measured type: seconds per failure source (None where a rate is
    missing), worker-hours, this machine's hours with `workers` side by side, and those scaled by `factors`."""
    factors = factors or {}
    entries = []
    for res in all_results:
        fast = fastest_type(res, fast_candidates, basis, works, sources)
        for backend, quant in dict.fromkeys([("llamacpp", "f32"), *([fast] if fast else [])]):
            r = on_basis(rates(res, backend, quant), basis)
            if r is None:
                continue
            seconds = [project_seconds(w, r, full_scale(w, sources)) for w in works]
            total = None if None in seconds else sum(seconds) / 3600
            calibrated = None if None in seconds or len(factors) < len(works) else \
                sum(h * factors[w["failures"]] for h, w in zip(seconds, works)) / 3600 / workers
            entries.append({"label": res["label"], "backend": backend, "quant": quant,
                            "exact": (backend, quant) == ("llamacpp", "f32"), "fastest": (backend, quant) == fast,
                            "seconds": seconds, "worker_hours": total,
                            "machine_hours": None if total is None else total / workers, "calibrated_hours": calibrated})
    return entries


def projection_rows(entries: Sequence[dict], works: Sequence[dict], threads: int, workers: int) -> list[str]:
    """The projected grid (`projected_grid`) as a markdown table: worker-hours at the measured `threads` per worker,
    and this machine's wall hours with `workers` such workers side by side (the sweep's --workers/--threads)."""
    lines = ["| model | type | " + " | ".join(f"{w['failures']}: worker-h" for w in works)
             + f" | grid: worker-hours ({threads} thread{'s' if threads > 1 else ''} per worker) | "
             f"grid on this machine: hours ({workers} workers) | the same × the 135M's measured/projected |",
             "|---|---|" + "---|" * (len(works) + 3)]
    for e in entries:
        tag = ", ".join(t for t, on in (("exact default", e["exact"]), ("fastest measured", e["fastest"])) if on)
        lines.append(f"| {e['label']} | {e['backend']} {e['quant']} ({tag}) | "
                     + " | ".join(_f(h / 3600 if h is not None else None, 1) for h in e["seconds"])
                     + f" | {_f(e['worker_hours'], 1)} | {_f(e['machine_hours'], 1)} | {_f(e['calibrated_hours'], 1)} |")
    return lines


def _calibration_pairs(works: Sequence[dict], results_135m: dict, workers: int, basis: str):
    """Per failure source the 135M's study measured: (work, its projected seconds run by `workers` side by side,
    the seconds the study measured for its scoring and decoding stages)."""
    for w in works:
        r = on_basis(rates(results_135m, "llamacpp", w.get("quant") or "f32"), basis)
        projected = project_seconds(w, r, 1.0) if r else None
        if projected:
            measured = sum(s for stage, (s, _) in w["stages"].items() if stage in SCORE_STAGES + DECODE_STAGES)
            yield w, projected / workers, measured


def calibration_factors(works: Sequence[dict], results_135m: dict, workers: int,
                        basis: str = "wall") -> dict[str, float]:
    """Per failure source: the study's measured seconds / the 135M's projected seconds of the same run."""
    return {w["failures"]: measured / projected
            for w, projected, measured in _calibration_pairs(works, results_135m, workers, basis)}


def calibration(works: Sequence[dict], results_135m: dict, workers: int, basis: str = "wall") -> list[str]:
    """The 135M row checked against the study it came from: its projected seconds (at the measured rates, `workers`
    side by side) vs the seconds the study measured for its scoring and decoding stages."""
    return [f"Check on the 135M, {w['failures']} failures: projected {projected:.0f} s vs measured {measured:.0f} s "
            f"for the same run's scoring and decoding stages (measured / projected {measured / projected:.2f})."
            for w, projected, measured in _calibration_pairs(works, results_135m, workers, basis)]


def render(all_results: Sequence[dict], works: Sequence[dict], sources: dict[str, int] | None,
           configs: Sequence[tuple[str, str]], threads: int = 1, cores: int = 2, basis: str = "wall",
           study_workers: int | None = None) -> str:
    """The markdown tables: conversions, scoring rates, and (given study runs) the projected grid, at the rates by
    wall time or per CPU second (`basis`). The 135M's check compares its study run with the projection run by
    `study_workers` one-thread workers (default: this machine's, cores // threads)."""
    out = ["Conversion (each step in its own process, its read-back check included; CPU s: user + system of the step "
           "and its subprocesses)", "", *conversion_rows(all_results), "",
           "Scoring and decoding (bench workload; medians of the timed runs)", "", *scoring_rows(all_results, configs)]
    ratios = ratio_rows(all_results, configs)
    if len(ratios) > 2:
        out += ["", "Rates relative to llama.cpp f32 of the same model (the rows above: type / f32, by wall time; in "
                "brackets by the worker's CPU time, where recorded)", "", *ratios]
    loads = sorted({tuple(s.get("load_average_before", ())) for r in all_results for s in r["steps"].values()
                    if s.get("load_average_before")})
    if loads:
        one_minute = [load[0] for load in loads]
        out += ["", f"Load average (1 min) before the steps: {min(one_minute):.2f}–{max(one_minute):.2f}."]
    if works and sources:
        out += ["", f"Projected full grid (sources in the data: {', '.join(f'{k} {v}' for k, v in sources.items())}; "
                "each failure source's stage tokens per examined source from the study run, at the measured rates"
                + (" per CPU second: each worker has its whole core)" if basis == "cpu" else " by wall time)")]
        real = next((r for r in all_results if not r["standin"]), None)
        machine_workers = max(1, cores // threads)
        factors = calibration_factors(works, real, study_workers or machine_workers, basis) if real is not None else {}
        entries = projected_grid(all_results, works, sources, configs, machine_workers, factors, basis)
        out += ["", *projection_rows(entries, works, threads, machine_workers)]
        totals = [(e["machine_hours"], e["calibrated_hours"]) for e in entries
                  if e["exact"] and e["machine_hours"] is not None and e["calibrated_hours"] is not None]
        if totals:
            out += ["", f"Every model measured above at its exact default, one after another on this machine: "
                    f"{sum(t[0] for t in totals):.0f} h projected, {sum(t[1] for t in totals):.0f} h scaled by "
                    f"the 135M's measured/projected ({len(totals)} models)."]
        if real is not None:
            out += ["", *calibration(works, real, study_workers or machine_workers, basis)]
    return "\n".join(out)
