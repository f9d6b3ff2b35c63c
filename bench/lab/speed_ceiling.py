"""How fast a study run could be with every stage at its reference: the ceiling on #32's speed-up.

    python -m fastscore.bench.lab.speed_ceiling RUN SCRATCH [--threads 2] [--base-rate R] [--json-out FILE]

RUN is a study's `--out` folder (its `seeded/` and `model/` runs). Two measurements of this one command:
- study_bound.py on the run's folders: each stage's tokens at the sgemm rate measured now (attention, the lm_head
  and all work outside the model free);
- decode_reference.py on each folder: its greedy stage run again in SCRATCH, the decoder's seconds split into first
  prefill, steps that join contexts, plain steps and host work, the plain steps set against their rows'
  arithmetic at one thread's sgemm rate plus reading their KV cells once.

The ceiling then puts each stage at its reference, generously: scoring at its bound; in the decoder, the plain steps
at their reference, prefill taking the share of its time that scoring's bound takes of scoring's (prefill is the same
batched forward), host work between steps as it is; building on-policy items (the same decoder on the model's attempts) at its
source's decoder share with the same tokens; every other stage as it is. Two further rows take prefill away from
greedy decoding: its first prefill (what continuing from the scoring pass's KV could save) and all of it (the
joining steps' rows go too). Each stage's wall is taken to shrink with its decoder's lane-seconds: what a stage does
outside the decoder (running attempts in the sandbox, rendering) shrinks with it, and the share comes from
decoder_calls' re-run, whose calls are each decoded on their own rather than from the lanes' one queue; both err on
the generous side. `--base-rate` (a base
commit's item-runs per hour on the same workload, measured side by side with today's code) turns the ceilings into
speed-ups over that base. The ceilings' seconds move less between runs than the run's own (the machine's speed
drifts): set them against the base's measured rate, not against this run's speed-up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import click

SCORING, GREEDY, BUILD = "score candidate sets", "greedy decoding", "build items"
ON_POLICY = "model"  # the failure source whose items are built by decoding the model's attempts


@dataclass(frozen=True)
class DecoderSplit:
    """A failure source's greedy-stage decoder lane-seconds: in all, first prefill, steps joining contexts (their
    prefill included), plain steps, and the plain steps at their reference."""

    seconds: float
    first_prefill: float
    joins: float
    plain: float
    plain_reference: float

    @property
    def host(self) -> float:
        return self.seconds - self.first_prefill - self.joins - self.plain


@dataclass(frozen=True)
class Scenario:
    name: str
    keep_first_prefill: bool
    keep_joins: bool


SCENARIOS = (Scenario("the same tokens, each kernel at its reference", True, True),
             Scenario("and greedy's first prefill taken from the scoring pass's KV", False, True),
             Scenario("and no prefill at all in greedy decoding", False, False))


def decoder_share(split: DecoderSplit, prefill_share: float, scenario: Scenario) -> float:
    """The share of today's decoder seconds left at the references: plain steps at theirs, the prefill kept at
    `prefill_share` of its seconds, host work as it is."""
    prefill = split.first_prefill * scenario.keep_first_prefill + split.joins * scenario.keep_joins
    return (split.plain_reference + prefill_share * prefill + split.host) / split.seconds


def ceiling(stages: Mapping[str, Mapping[str, float]], bounds: Mapping[str, Mapping[str, float]],
            splits: Mapping[str, DecoderSplit], prefill_share: float, scenario: Scenario) -> dict[str, float]:
    """{stage: seconds at the ceiling} summed over the failure sources; `stages` and `bounds`: {source: {stage:
    measured (bound) seconds}}, `splits`: {source: its greedy stage's DecoderSplit}."""
    out: dict[str, float] = {}
    same_tokens = SCENARIOS[0]
    for source, measured in stages.items():
        for stage, seconds in measured.items():
            if stage == SCORING:
                seconds = bounds[source][stage]
            elif stage == GREEDY:
                seconds *= decoder_share(splits[source], prefill_share, scenario)
            elif stage == BUILD and source == ON_POLICY:  # attempts are decoded before scoring: none of its KV
                seconds *= decoder_share(splits[source], prefill_share, same_tokens)
            out[stage] = out.get(stage, 0.0) + seconds
    return out


def measure(run: Path, scratch: Path, threads: int) -> dict:
    from fastscore.bench.lab import decode_reference, study_bound

    folders = [run / s for s in ("seeded", ON_POLICY) if (run / s / "config.json").is_file()]
    if not folders:
        raise click.ClickException(f"{run} holds no study run (seeded/ or {ON_POLICY}/ with a config.json)")
    bound = study_bound.measure(folders, threads)
    stages = {r["failures"]: {s["stage"]: s["measured_seconds"] for s in r["stages"]} for r in bound["runs"]}
    bounds = {r["failures"]: {s["stage"]: s["bound_seconds"] for s in r["stages"]} for r in bound["runs"]}
    splits, references = {}, {}
    for folder, run_bound in zip(folders, bound["runs"], strict=True):  # study_bound keeps the folders' order
        source = run_bound["failures"]
        ref = decode_reference.measure(folder, scratch / source, threads)
        references[source] = decode_reference.render(ref)
        parts = [sum(p[k] for p in ref["split"].values()) for k in range(4)]
        splits[source] = DecoderSplit(*parts, plain_reference=sum(g["reference"] for g in ref["plain"].values()))
    scored = sum(s[SCORING] for s in stages.values())
    prefill_share = sum(b[SCORING] for b in bounds.values()) / scored
    return {"date_utc": bound["date_utc"], "sgemm_gflops_all_threads": bound["sgemm"]["gflops"], "threads": threads,
            "load_average": [bound["load_average_at_start"], bound["load_average_at_end"]],
            "item_runs": sum(r["item_runs"] for r in bound["runs"]), "stages": stages, "bounds": bounds,
            "splits": {s: asdict(v) for s, v in splits.items()}, "prefill_share": prefill_share,
            "references": references,
            "ceilings": {sc.name: ceiling(stages, bounds, splits, prefill_share, sc) for sc in SCENARIOS}}


def render(result: dict, base_rate: float | None) -> str:
    today = {}
    for measured in result["stages"].values():
        for stage, seconds in measured.items():
            today[stage] = today.get(stage, 0.0) + seconds
    total = sum(today.values())
    head = ["| stages at | scoring s | greedy decoding s | building items s | the rest s | all s | × today |"
            + (" × base |" if base_rate else ""),
            "|---|---|---|---|---|---|---|" + ("---|" if base_rate else "")]
    base_seconds = 3600.0 * result["item_runs"] / base_rate if base_rate else None

    def row(name: str, seconds: dict[str, float]) -> str:
        rest = sum(v for k, v in seconds.items() if k not in (SCORING, GREEDY, BUILD))
        whole = sum(seconds.values())
        cells = [name, *(f"{seconds.get(k, 0.0):.1f}" for k in (SCORING, GREEDY, BUILD)), f"{rest:.1f}",
                 f"{whole:.1f}", f"{total / whole:.2f}"]
        if base_seconds:
            cells.append(f"{base_seconds / whole:.2f}")
        return "| " + " | ".join(cells) + " |"

    lines = [f"{result['date_utc']}: {result['item_runs']} item-runs; sgemm {result['sgemm_gflops_all_threads']:.1f} "
             f"GFLOP/s at {result['threads']} threads; load average {result['load_average']}; prefill at the "
             f"reference takes {result['prefill_share']:.2f} of its time (scoring's bound / measured)", ""]
    for source, text in result["references"].items():
        lines += [f"decoder of the {source} source:", text, ""]
    if base_seconds:
        lines += [f"base: {base_rate:,.1f} item-runs per hour, {base_seconds:.1f} s for these item-runs", ""]
    lines += head + [row("today (measured)", today)] + [row(n, s) for n, s in result["ceilings"].items()]
    return "\n".join(lines)


@click.command()
@click.argument("run", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("scratch", type=click.Path(file_okay=False, path_type=Path))
@click.option("--threads", type=int, default=2, show_default=True, help="The run's threads (one per lane).")
@click.option("--base-rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="A base commit's item-runs per hour on the run's workload, measured side by side.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(run: Path, scratch: Path, threads: int, base_rate: float | None, json_out: Path | None) -> None:
    result = measure(run, scratch, threads)
    if json_out:
        json_out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    click.echo(render(result, base_rate))


if __name__ == "__main__":
    main()
