"""What a decoder step costs, and what keeping steps wide across calls would save, judged on the study's own calls.

    python -m fastscore.bench.lab.step_widths RUN_DIR SCRATCH [--threads 2]

RUN_DIR's greedy stage runs again in SCRATCH (bench/lab/decode_levers.py's recording: every decoder call's
sequences, the lane it ran on, each step's rows and seconds). Printed:

- **The step's cost**: a least-squares fit of the plain steps' seconds (no context joining) to a + b × rows: a is
  what a step costs whatever its width, b what each row adds. The fit ignores each row's attended cells (a call's
  tail holds its longest sequences at their longest) and mixes steps taken beside the other lane with steps taken
  alone: an approximation, which moves between runs.
- **Narrow steps**: the steps of fewer than 16 rows (a call's tail once its queue has drained, or a call of fewer
  sequences) and their share of the steps' seconds.
- **Sessions simulated** with the fit (steps only; prefill and joins left out), each call's sequences in the
  order its decoder started them (longest budget first): (a) each call its own session, on the lane it ran on (as
  the study runs); (b) each lane's calls as one session, the next call's sequences joining as the last call's
  finish; (c) one queue for both lanes, each lane's session taking the next sequence when a slot frees; (d) the same
  queue ordered longest budget first over all calls. Lane seconds and the stage's wall of steps (its slowest lane).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import click
import numpy as np

from fastscore.bench.lab.decode_levers import WIDTH, lane_steps, live_steps, record

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
    lane whose clock is earliest stepping next (the refill rule of live_steps): a step of r rows costs cost(r)."""
    waiting = deque(range(len(chosen)))
    sessions = [lane_steps(chosen, waiting, width) for _ in range(lanes)]
    clock = [0.0] * lanes
    going = set(range(lanes))
    while going:
        # At a tie the lower lane steps first: at time 0 lane 0 refills what its first fill left free before lane 1
        # fills, a shift of a few sequences at most (prefill is not simulated either).
        k = min(going, key=lambda lane: (clock[lane], lane))
        live = next(sessions[k], None)
        if live is None:  # nothing live and the queue empty: this lane is done (the queue only shrinks)
            going.discard(k)
            continue
        clock[k] += cost(len(live))
    return clock


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("scratch", type=click.Path(file_okay=False, path_type=Path))
@click.option("--threads", type=int, default=2, show_default=True)
def main(run_dir: Path, scratch: Path, threads: int) -> None:
    # A recorded call's sequences are in the order the decoder started them: the scorer passes a call's requests
    # longest budget first, and the recording keeps that order.
    calls = sorted(record(run_dir, scratch, threads), key=lambda c: c["started"])
    steps = [(r, j, s) for c in calls for r, j, s in zip(c["step_rows"], c["step_joins"], c["step_seconds"],
                                                          strict=True)]
    plain = [(r, s) for r, j, s in steps if not j]
    a, b = fit_step_cost(*zip(*plain))
    narrow = [(r, s) for r, _, s in steps if r < NARROW]
    narrow_rows, all_rows = sum(r for r, _ in narrow), sum(r for r, _, _ in steps)
    narrow_seconds, all_seconds = sum(s for _, s in narrow), sum(s for _, _, s in steps)
    click.echo(f"\n**The step's cost** ({len(plain):,} plain steps of {len(steps):,}, least squares): "
               f"{1000 * a:.1f} ms a step + {1000 * b:.2f} ms a row\n")
    per_row = f"{1000 * narrow_seconds / narrow_rows:.1f} ms a row there, " if narrow_rows else ""
    click.echo(f"Steps of fewer than {NARROW} rows: {len(narrow):,} of {len(steps):,}, {narrow_rows:,} of "
               f"{all_rows:,} rows, {narrow_seconds:.1f} of {all_seconds:.1f} step-seconds ({per_row}"
               f"{1000 * all_seconds / all_rows:.1f} over all steps, join steps' prefill included)\n")

    def cost(rows: int) -> float:
        return a + b * rows

    simulated = [session_rows(c["chosen"]) for c in calls]
    click.echo(f"Simulated: {sum(len(r) for r in simulated):,} steps, {sum(map(sum, simulated)):,} rows; recorded: "
               f"{len(steps):,} steps, {all_rows:,} rows (ban twins that parted counted whole, as decode_levers "
               "does)\n")
    lanes = sorted({c["lane"] for c in calls})
    on_lane = {lane: [n for n, c in enumerate(calls) if c["lane"] == lane] for lane in lanes}
    per_call = {lane: sum(cost(r) for n in on_lane[lane] for r in simulated[n]) for lane in lanes}
    one_session = {lane: sum(cost(r) for r in session_rows([x for n in on_lane[lane] for x in calls[n]["chosen"]]))
                   for lane in lanes}
    queue = shared_queue([x for c in calls for x in c["chosen"]], len(lanes), cost)
    by_budget = sorted(((budget, chosen) for c in calls for budget, chosen in zip(c["budgets"], c["chosen"],
                                                                                    strict=True)),
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
