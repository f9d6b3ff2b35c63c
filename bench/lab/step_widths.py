"""What a decoder step costs, and what keeping steps wide across calls would save, judged on the study's own calls.

    python -m fastscore.bench.lab.step_widths RUN_DIR SCRATCH [--threads 2]

RUN_DIR's greedy stage runs again in SCRATCH (bench/lab/decode_levers.py's recording: every decoder call's
sequences, the lane it ran on, each step's rows and seconds). Printed:

- **The step's cost**: a least-squares fit of the plain steps' seconds (no context joining) to a + b × rows: a is
  what a step costs whatever its width (reading the weights), b what each row adds.
- **Narrow steps**: the steps of fewer than 16 rows (a call's tail, once its queue has drained) and their share of
  the steps' seconds.
- **Sessions simulated** with the fit (steps only; prefill and joins left out), each call's sequences in the
  decoder's order (longest budget first): (a) each call its own session, on the lane it ran on (as the study runs);
  (b) each lane's calls as one session, the next call's sequences joining as the last call's finish; (c) one queue
  for both lanes, each lane's session taking the next sequence when a slot frees; (d) the same queue ordered longest
  budget first over all calls. Lane seconds and the stage's wall of steps (its slowest lane).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import click
import numpy as np

from fastscore.bench.lab.decode_levers import WIDTH, live_steps, record

NARROW = 16


def fit_step_cost(rows: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(a, b) of seconds ≈ a + b × rows, least squares."""
    design = np.column_stack([np.ones(len(rows)), np.asarray(rows, dtype=float)])
    (a, b), *_ = np.linalg.lstsq(design, np.asarray(seconds, dtype=float), rcond=None)
    return float(a), float(b)


def session_rows(chosen: Sequence[int], width: int = WIDTH) -> list[int]:
    """Rows of each step of one refilling session over sequences choosing `chosen` tokens, in the order given."""
    return [len(live) for live in live_steps(chosen, range(len(chosen)), width)]


def shared_queue(chosen: Sequence[int], lanes: int, cost: Callable[[int], float], width: int = WIDTH) -> list[float]:
    """Seconds of each lane's session when `lanes` sessions take sequences from one queue (in the order given), the
    lane whose clock is earliest stepping next: a step of r rows costs cost(r). The first `width` of a lane start with
    the prefill's token, a sequence joining later feeds its last context token first (as live_steps)."""
    queue = list(range(len(chosen)))[::-1]
    clock = [0.0] * lanes
    live: list[dict[int, int]] = [{} for _ in range(lanes)]
    started = [False] * lanes
    while True:
        ready = [k for k in range(lanes) if live[k] or queue]
        if not ready:
            return clock
        k = min(ready, key=clock.__getitem__)
        while queue and len(live[k]) < width:
            live[k][queue.pop()] = 0 if started[k] else 1
        started[k] = True
        live[k] = {i: done for i, done in live[k].items() if done < chosen[i]}
        if not live[k]:
            continue
        clock[k] += cost(len(live[k]))
        live[k] = {i: done + 1 for i, done in live[k].items() if done + 1 < chosen[i]}


def _in_decoder_order(call: dict) -> list[int]:
    """The call's `chosen` in the order its sequences start: longest budget first (a stable sort, as the scorer's)."""
    order = sorted(range(len(call["chosen"])), key=lambda i: -call["budgets"][i])
    return [call["chosen"][i] for i in order]


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("scratch", type=click.Path(file_okay=False, path_type=Path))
@click.option("--threads", type=int, default=2, show_default=True)
def main(run_dir: Path, scratch: Path, threads: int) -> None:
    calls = sorted(record(run_dir, scratch, threads), key=lambda c: c["started"])
    plain = [(r, s) for c in calls for r, j, s in zip(c["step_rows"], c["step_joins"], c["step_seconds"]) if not j]
    a, b = fit_step_cost(*zip(*plain))
    every = [(r, s) for c in calls for r, s in zip(c["step_rows"], c["step_seconds"])]
    narrow = [(r, s) for r, s in every if r < NARROW]
    click.echo(f"\n**The step's cost** ({len(plain):,} plain steps of {len(every):,}): {1000 * a:.1f} ms a step + "
               f"{1000 * b:.2f} ms a row\n")
    click.echo(f"Steps of fewer than {NARROW} rows: {len(narrow):,} of {len(every):,}, "
               f"{sum(r for r, _ in narrow):,} of {sum(r for r, _ in every):,} rows, "
               f"{sum(s for _, s in narrow):.1f} of {sum(s for _, s in every):.1f} step-seconds "
               f"({sum(r for r, _ in narrow) and 1000 * sum(s for _, s in narrow) / sum(r for r, _ in narrow):.1f} ms "
               f"a row there, {1000 * sum(s for _, s in every) / sum(r for r, _ in every):.1f} over all steps)\n")

    def cost(rows: int) -> float:
        return a + b * rows

    simulated = [session_rows(_in_decoder_order(c)) for c in calls]
    click.echo(f"Simulated steps {sum(len(r) for r in simulated):,} against {len(every):,} recorded "
               "(ban twins that parted counted whole, as decode_levers does)\n")
    lanes = sorted({c["lane"] for c in calls})
    on_lane = {lane: [n for n, c in enumerate(calls) if c["lane"] == lane] for lane in lanes}
    per_call = {lane: sum(cost(r) for n in on_lane[lane] for r in simulated[n]) for lane in lanes}
    one_session = {lane: sum(cost(r) for r in session_rows([x for n in on_lane[lane]
                                                            for x in _in_decoder_order(calls[n])]))
                   for lane in lanes}
    queue = shared_queue([x for c in calls for x in _in_decoder_order(c)], len(lanes), cost)
    by_budget = sorted(((budget, chosen) for c in calls for budget, chosen in zip(c["budgets"], c["chosen"])),
                       key=lambda pair: -pair[0])
    queue_by_budget = shared_queue([chosen for _, chosen in by_budget], len(lanes), cost)
    click.echo("| sessions (steps only, the fit's cost) | lane seconds | wall of steps (slowest lane) | "
               "against (a) |")
    click.echo("|---|---|---|---|")
    base = max(per_call.values())
    for name, seconds in (("(a) a session per call, on its lane (as run)", list(per_call.values())),
                          ("(b) a session per lane, its calls one after another", list(one_session.values())),
                          ("(c) one queue for both lanes", queue),
                          ("(d) one queue for both lanes, longest budget first over all calls", queue_by_budget)):
        click.echo(f"| {name} | {' + '.join(f'{s:.1f}' for s in seconds)} | {max(seconds):.1f} | "
                   f"{base / max(seconds):.3f}× |")


if __name__ == "__main__":
    main()
