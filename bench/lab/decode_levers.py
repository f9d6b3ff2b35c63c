"""Two decoding levers judged on the study's own decoder calls before building them: drafts looked up in the context
(prompt-lookup speculative decoding) and ordering a call's requests by length (the attention's masked cells).

    python -m fastscore.bench.lab.decode_levers RUN_DIR SCRATCH [--threads 2] [--time-steps 8]

RUN_DIR: one failure source's folder of a finished `fastscore study` run (e.g. OUT/model), left untouched. Its greedy
stage runs again on a copy in SCRATCH (as `decoder_calls` does), every decoder call's contexts and completions
recorded; then both levers are simulated on exactly those tokens (`--time-steps` also times drafted steps):

- **Drafts.** Each step a live sequence is fed its token plus k drafted ones, the k tokens that followed the latest
  earlier occurrence of its last n tokens (n = 3, 2, 1) in its context and completion so far; the step's rows accept
  the drafts its choices reproduce. On an exact, batch-invariant type (f32) every row has the bits of a one-token
  step, and a sampled sequence draws once per token it keeps, so the completions are those of decoding one token
  at a time. Printed: tokens per sequence-step and rows computed per token kept, greedy and sampled.
- **Cells attended.** llama.cpp attends every live stream over the longest live stream's cells (padded to 64), so
  a refilled call of 32 streams of unequal lengths attends masked cells. Printed per call: cells attended and needed
  per row, for the decoder's order (longest budget first) and for orders by length.

Its recording (`record`, which also times each step and notes each call's lane) and the refill rule (`live_steps`,
`lane_steps`) serve bench/lab/step_widths.py too.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import click
import numpy as np

from fastscore.bench.lab.decoder_calls import call_kind
from fastscore.bench.lab.refill_decode import CountingDecoder

WIDTH = 32  # the scorer's max_decode_batch
CELL_PAD = 64  # llamacpp/0002


def lookup_draft(tokens: Sequence[int], k: int, longest_ngram: int = 3) -> list[int]:
    """The k tokens after the latest earlier occurrence of the last n tokens of `tokens` (n from longest_ngram down
    to 1), or [] where none occurs."""
    size = len(tokens)
    for n in range(min(longest_ngram, size - 1), 0, -1):
        tail = list(tokens[size - n :])
        for start in range(size - n - 1, -1, -1):
            if list(tokens[start : start + n]) == tail:
                return list(tokens[start + n : start + n + k])
    return []


def drafted_steps(context: Sequence[int], completion: Sequence[int], chosen: int, k: int) -> int:
    """Decoder steps one sequence takes to choose `chosen` tokens (the completion's, plus its stop token if it chose
    one) with k drafted tokens per step; the first token comes from the prefill, as without drafts. (A sequence that
    joins a refilled call takes its first token from a step, which could carry drafts too: left out on both sides of
    the ratio, so tokens per step are barely moved.)"""
    steps, done = 0, 1  # the first token comes from the prefill's logits
    while done < chosen:
        steps += 1
        draft = lookup_draft(list(context) + list(completion[:done]), k)
        kept = 0
        while kept < len(draft) and done + kept < len(completion) and completion[done + kept] == draft[kept]:
            kept += 1
        done += kept + 1
    return steps


def live_steps(chosen: Sequence[int], order: Sequence[int], width: int = WIDTH):
    """The live requests of each step of a refilled call, as {request: tokens chosen before the step}: at most
    `width` live, a finished request's slot taken at once by the next in `order`. The first `width` start with the
    prefill's token; a request joining later feeds its last context token in its first step."""
    return lane_steps(chosen, deque(order), width)


def lane_steps(chosen: Sequence[int], waiting: deque, width: int = WIDTH):
    """live_steps of one decoder session taking its requests from `waiting` as its slots free, one step per next():
    sessions sharing one deque take from it in the order they step."""
    live: dict[int, int] = {}
    while waiting and len(live) < width:  # the session's start: their first tokens come from its prefill
        live[waiting.popleft()] = 1
    while True:
        live = {i: done for i, done in live.items() if done < chosen[i]}  # finished: its slot is free at once
        while waiting and len(live) < width:
            live[waiting.popleft()] = 0
        if not live:
            return
        yield live
        live = {i: done + 1 for i, done in live.items()}


def cells_attended(lengths: Sequence[int], chosen: Sequence[int], order: Sequence[int],
                   width: int = WIDTH) -> tuple[int, int, int]:
    """(rows, cells attended, cells needed) of a refilled call (live_steps), every live row attending the longest
    live stream's cells, padded. A step's row attends `lengths + done` cells of its own."""
    rows = attended = needed = 0
    for live in live_steps(chosen, order, width):
        used = [lengths[i] + done for i, done in live.items()]
        longest = -(-max(used) // CELL_PAD) * CELL_PAD
        rows += len(used)
        attended += longest * len(used)
        needed += sum(used)
    return rows, attended, needed


def time_drafted_steps(scorer, contexts: Sequence[Sequence[int]], ks: Sequence[int], steps: int) -> dict[int, float]:
    """{k: median seconds of one decoder step feeding each context 1 + k tokens}, on the backend's own stream decoder
    (one KV stream per context, one micro-batch per step, every row's logits returned, as a drafted step needs).
    Each step's cells are removed after it, so every step of every k runs at the same positions (right after the
    contexts) and attends the same cells."""
    import statistics

    import numpy as np

    from fastscore.engine.plan import Batch

    reserve = 1 + max(ks)
    decoder = scorer.backend.decoder(reserve)
    out: dict[int, float] = {}
    with decoder:
        decoder.reserve_slots(len(contexts), max(len(c) for c in contexts) + reserve)
        decoder.start([list(c) for c in contexts])
        stream, lib = decoder.groups[0], scorer.backend._L
        seqs = [stream.stream_of[i] for i in range(len(contexts))]
        order = sorted(range(len(contexts)), key=seqs.__getitem__)  # ascending streams: one micro-batch
        for k in ks:
            width = 1 + k  # every step of this k feeds the same tokens at the same positions
            tokens = np.concatenate([np.asarray(contexts[i][-width:], dtype=np.int32) for i in order])
            positions = np.concatenate([np.arange(decoder.next_pos[i], decoder.next_pos[i] + width, dtype=np.int32)
                                        for i in order])
            runs = tuple((n * width, (n + 1) * width, np.array([seqs[i]], dtype=np.int32)) for n, i in enumerate(order))
            batch = Batch(tokens=tokens, positions=positions, outputs=np.ones(len(tokens), dtype=bool), runs=runs,
                          n_seqs=len(contexts))
            if len(tokens) > stream.n_batch:
                raise click.UsageError(f"{len(tokens)} tokens a step exceed the decoder's batch of {stream.n_batch}")
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                stream.cache.forward(batch)
                times.append(time.perf_counter() - start)
                for i in order:
                    lib.llama_memory_seq_rm(stream.memory, seqs[i], decoder.next_pos[i], -1)
            out[k] = statistics.median(times)
    return out


class TimedDecoder(CountingDecoder):
    """A pass-through decoder recording each step's rows, the contexts joining at it and its seconds (a join step's
    include prefilling the joining contexts)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.seconds: list[float] = []
        self.cells: list[int | None] = []  # cells the step's rows attend in all (None: the decoder does not say)
        self.start_seconds = 0.0  # the first prefill: the contexts that start the call

    def start(self, contexts):
        started = time.perf_counter()
        out = super().start(contexts)
        self.start_seconds += time.perf_counter() - started
        return out

    def _attended(self, active, joining=()) -> int | None:
        # A stream decoder's next_pos[i]: the position sequence i's next token takes, so its row attends next_pos + 1
        # cells; a joining context's last token runs in the step, at position len - 1.
        positions = getattr(self.inner, "next_pos", None)
        if positions is None:
            return None
        return sum(positions[i] + 1 for i in active) + sum(len(c) for c in joining)

    def step(self, active, tokens):
        self.cells.append(self._attended(active))
        started = time.perf_counter()
        out = super().step(active, tokens)
        self.seconds.append(time.perf_counter() - started)
        return out

    def join_step(self, active, tokens, joining):
        self.cells.append(self._attended(active, joining))
        started = time.perf_counter()
        out = super().join_step(active, tokens, joining)
        self.seconds.append(time.perf_counter() - started)
        return out


def record(run_dir: Path, scratch: Path, threads: int) -> list[dict]:
    """The greedy stage of `run_dir` run again in `scratch` (bench/lab/decoder_calls.py), each decoder call
    recorded (_recorded_calls)."""
    from fastscore.bench.lab import decoder_calls

    calls: list[dict] = []
    patch = _recorded_calls(calls, decoder_calls.item_envs(run_dir))
    patch(True)
    try:
        decoder_calls.main([str(run_dir), str(scratch), "--threads", str(threads)], standalone_mode=False)
    finally:
        patch(False)
    return calls


def _recorded_calls(calls: list[dict], env_of: dict[str, str]):
    """A switch for fastscore.scorer.greedy_decode wrapped to append each call's environment, contexts, completions
    and budgets (the sequences it ran: not the ban twins that never left the context they followed); `env_of`:
    item id -> environment (a study call holds one environment's items)."""
    import fastscore.scorer as scorer_module
    from fastscore.decode_units import greedy_followers
    from fastscore.study.stages import decode as stage

    lock, decode = threading.Lock(), scorer_module.greedy_decode
    current = threading.local()  # the environment of the study's call this lane thread is running
    run_call = stage.DecoderCall.run

    def run_noting_env(call, scorer):
        current.env = env_of[next(iter(call.requests))]
        try:
            return run_call(call, scorer)
        finally:
            current.env = ""

    def recording(decoder, contexts, **kw):
        started, timed = time.perf_counter(), TimedDecoder(decoder)
        out = decode(timed, contexts, **kw)
        call_seconds = time.perf_counter() - started
        budgets = kw["max_new_tokens"]
        budgets = [budgets] * len(out) if isinstance(budgets, int) else list(budgets)
        temperature = kw.get("temperature", 0.0)
        temperatures = [temperature] * len(out) if np.isscalar(temperature) else list(temperature)
        sampled = [t > 0 for t in temperatures]
        # A greedy context that repeats an earlier one under another ban follows it and runs no sequence of its own
        # while they write the same tokens (the study's `ban` follows `after`): left out where it never parted. One
        # that parted is kept whole, as if it ran from its start: its steps before parting are over-counted (rare
        # in the study, where 80-100% of `ban` completions never part from `after`'s).
        rules = kw.get("action_done") or [None] * len(out)
        refilling = kw.get("width") is not None and decoder.refills
        following = greedy_followers(contexts, budgets, rules, kw.get("starts"), temperatures) if refilling else {}
        own = [i for i in range(len(out)) if i not in following or out[i].token_ids != out[following[i]].token_ids]
        with lock:
            calls.append({"contexts": [list(contexts[i]) for i in own], "sampled": [sampled[i] for i in own],
                          "kind": call_kind(len(out) - sum(sampled), sum(sampled)),
                          "completions": [list(out[i].token_ids) for i in own],
                          "chosen": [len(out[i].token_ids) + (out[i].stopped_by == "end_of_turn") for i in own],
                          "budgets": [budgets[i] for i in own], "followers": len(out) - len(own),
                          "env": getattr(current, "env", ""), "lane": threading.current_thread().name,
                          "started": started, "step_rows": timed.rows, "step_joins": timed.joins,
                          "step_seconds": timed.seconds, "step_cells": timed.cells,
                          "start_seconds": timed.start_seconds, "call_seconds": call_seconds})
        return out

    can_serve = scorer_module.Scorer.can_serve_greedy

    def patch(on: bool) -> None:
        scorer_module.greedy_decode = recording if on else decode
        stage.DecoderCall.run = run_noting_env if on else run_call
        # What is recorded is each call decoded whole: the stage's queue (decode_queue.served) is switched off.
        scorer_module.Scorer.can_serve_greedy = (lambda self: False) if on else can_serve

    return patch


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("scratch", type=click.Path(file_okay=False, path_type=Path))
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--time-steps", type=int, default=0, show_default=True,
              help="Also time this many decoder steps per k: the first 32 contexts of the sampled call that chose the "
                   "most tokens, each fed 1 + k tokens a step (0: do not time).")
def main(run_dir: Path, scratch: Path, threads: int, time_steps: int) -> None:
    calls = record(run_dir, scratch, threads)

    tokens_per_step: dict[tuple[bool, int], float] = {}
    click.echo("\n**Drafts** (prompt lookup, n-gram <= 3; k drafted tokens per sequence and step; tokens chosen in "
               "steps: each sequence's first token, from the prefill, not counted; stop tokens counted)\n")
    click.echo("| sequences | k | tokens chosen in steps | sequence-steps | tokens per sequence-step | "
               "rows per token |")
    click.echo("|---|---|---|---|---|---|")
    for sampled in (False, True):
        pairs = [(ctx, out, n) for c in calls
                 for ctx, out, n, kind in zip(c["contexts"], c["completions"], c["chosen"], c["sampled"])
                 if kind == sampled]
        if not pairs:
            continue
        stepped = sum(n - 1 for _, _, n in pairs)
        for k in (0, 1, 2, 3, 4, 8):
            steps = sum(drafted_steps(ctx, out, n, k) for ctx, out, n in pairs)
            tokens_per_step[sampled, k] = stepped / steps
            click.echo(f"| {'sampled' if sampled else 'greedy'} ({len(pairs)}) | {k} | {stepped:,} | {steps:,} | "
                       f"{stepped / steps:.2f} | {steps * (1 + k) / stepped:.2f} |")

    if time_steps:
        _print_step_times(run_dir, calls, threads, time_steps, tokens_per_step)

    click.echo(f"\n**Cells attended per row** (calls of more than one sequence; at most {WIDTH} live)\n")
    click.echo("| call | sequences (ban twins that never parted, left out) | order | rows | cells attended per row | "
               "needed | masked share |")
    click.echo("|---|---|---|---|---|---|---|")
    for n, call in enumerate(calls):
        lengths, chosen, budgets = [len(c) for c in call["contexts"]], call["chosen"], call["budgets"]
        size = len(lengths)
        if size < 2:
            continue
        orders = {"longest budget first (the decoder's)": sorted(range(size), key=lambda i: -budgets[i]),
                  "longest context + budget first": sorted(range(size), key=lambda i: -(lengths[i] + budgets[i])),
                  "longest context first": sorted(range(size), key=lambda i: -lengths[i])}
        for name, order in orders.items():
            rows, attended, needed = cells_attended(lengths, chosen, order)
            click.echo(f"| {n} {call['env']} {call['kind']} | {size} ({call['followers']}) | {name} | {rows:,} | "
                       f"{attended / rows:.0f} | {needed / rows:.0f} | {1 - needed / attended:.2f} |")


def _print_step_times(run_dir: Path, calls: list[dict], threads: int, steps: int,
                      tokens_per_step: dict[tuple[bool, int], float]) -> None:
    from fastscore.selection import ModelSelection

    settings = json.loads((run_dir / "config.json").read_text())
    sampled_calls = [c for c in calls if any(c["sampled"])]
    if not sampled_calls:
        click.echo("\nNo sampled call to time (a seeded run?): --time-steps needs an on-policy run's folder.")
        return
    # the most sampled tokens
    largest = max(sampled_calls, key=lambda c: sum(n for n, kind in zip(c["chosen"], c["sampled"]) if kind))
    contexts = [ctx for ctx, kind in zip(largest["contexts"], largest["sampled"]) if kind][:WIDTH]
    ks = (0, 1, 2, 3, 4)
    selection = ModelSelection.resolve(settings["model"], settings["backend"], settings["quant"], threads=threads)
    with selection.open() as scorer:
        seconds = time_drafted_steps(scorer, contexts, ks, steps)
    mean = sum(len(c) for c in contexts) / len(contexts)
    click.echo(f"\n**Drafted steps timed** (the first {len(contexts)} contexts of the sampled call that chose the most "
               f"tokens, {largest['env']}: {mean:.0f} tokens on average; {threads} "
               f"threads, median of {steps} steps; per token: estimated, the timed step over its contexts times the "
               "tokens per sequence-step simulated above)\n")
    click.echo("| k | rows per step | ms per step | ms per row | greedy: ms per token (estimated) | "
               "sampled: ms per token (estimated) |")
    click.echo("|---|---|---|---|---|---|")
    n = len(contexts)
    for k in ks:
        ms = seconds[k] * 1000
        greedy, sampled = (ms / (n * tokens_per_step[kind, k]) if (kind, k) in tokens_per_step else float("nan")
                           for kind in (False, True))
        click.echo(f"| {k} | {n * (1 + k)} | {ms:.1f} | {ms / (n * (1 + k)):.2f} | {greedy:.2f} | {sampled:.2f} |")


if __name__ == "__main__":
    main()
