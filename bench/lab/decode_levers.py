"""Two decoding levers judged on the study's own decoder calls before building them: drafts looked up in the context
(prompt-lookup speculative decoding) and ordering a call's requests by length (the attention's masked cells).

    python -m fastscore.bench.lab.decode_levers RUN_DIR SCRATCH [--threads 2]

RUN_DIR: one failure source's folder of a finished `fastscore study` run (e.g. OUT/model), left untouched. Its greedy
stage runs again on a copy in SCRATCH (as `decoder_calls` does), every decoder call's contexts and completions
recorded; then both levers are simulated on exactly those tokens, nothing timed:

- **Drafts.** Each step a live sequence is fed its token plus k drafted ones, the k tokens that followed the latest
  earlier occurrence of its last n tokens (n = 3, 2, 1) in its context and completion so far; the step's rows accept
  the drafts its choices reproduce. On an exact, batch-invariant type (f32) every row has the bits of a one-token
  step, and a sampled sequence draws once per token it keeps, so the completions are those of decoding one token
  at a time. Printed: tokens per sequence-step and rows computed per token kept, greedy and sampled.
- **Cells attended.** llama.cpp attends every live stream over the longest live stream's cells (padded to 64), so
  a refilled call of 32 streams of unequal lengths attends masked cells. Printed per call: cells attended and needed
  per row, for the decoder's order (longest budget first) and for orders by length.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import click

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
    """Sequence-steps to choose `chosen` tokens (the completion's, plus its stop token if it chose one) with k
    drafted tokens per step; the first token comes from the prefill, as without drafts."""
    steps, done = 0, 0
    while done < chosen:
        steps += 1
        if k == 0 or done == 0:
            done += 1
            continue
        draft = lookup_draft(list(context) + list(completion[:done]), k)
        kept = 0
        while kept < len(draft) and done + kept < len(completion) and completion[done + kept] == draft[kept]:
            kept += 1
        done += kept + 1
    return steps


def cells_attended(lengths: Sequence[int], chosen: Sequence[int], order: Sequence[int],
                   width: int = WIDTH) -> tuple[int, int, int]:
    """(rows, cells attended, cells needed) of a refilled call: at most `width` live, a finished request's slot
    taken at once by the next in `order`, every live row attending the longest live stream's cells, padded."""
    waiting, live = deque(order), {}
    rows = attended = needed = 0
    while waiting or live:
        while waiting and len(live) < width:
            live[waiting.popleft()] = 0
        used = [lengths[i] + done + 1 for i, done in live.items()]
        longest = -(-max(used) // CELL_PAD) * CELL_PAD
        rows += len(used)
        attended += longest * len(used)
        needed += sum(used)
        for i in list(live):
            live[i] += 1
            if live[i] >= chosen[i]:
                del live[i]
    return rows, attended, needed


def _recorded_calls(calls: list[dict]):
    """fastscore.scorer.greedy_decode wrapped to append each call's contexts, completions and temperature."""
    import fastscore.scorer as scorer_module

    lock, decode = threading.Lock(), scorer_module.greedy_decode

    def recording(decoder, contexts, **kw):
        out = decode(decoder, contexts, **kw)
        budgets = kw["max_new_tokens"]
        with lock:
            calls.append({"contexts": [list(c) for c in contexts], "sampled": kw.get("temperature", 0.0) > 0,
                          "completions": [list(d.token_ids) for d in out],
                          "chosen": [max(1, len(d.token_ids) + (d.stopped_by == "end_of_turn")) for d in out],
                          "budgets": [budgets] * len(out) if isinstance(budgets, int) else list(budgets)})
        return out

    return scorer_module, decode, recording


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("scratch", type=click.Path(file_okay=False, path_type=Path))
@click.option("--threads", type=int, default=2, show_default=True)
def main(run_dir: Path, scratch: Path, threads: int) -> None:
    from fastscore.bench.lab import decoder_calls

    calls: list[dict] = []
    module, decode, recording = _recorded_calls(calls)
    module.greedy_decode = recording
    try:
        decoder_calls.main([str(run_dir), str(scratch), "--threads", str(threads)], standalone_mode=False)
    finally:
        module.greedy_decode = decode

    click.echo("\n**Drafts** (prompt lookup, n-gram <= 3; k drafted tokens per sequence and step)\n")
    click.echo("| completions | k | tokens kept | sequence-steps | tokens per sequence-step | rows per token kept |")
    click.echo("|---|---|---|---|---|---|")
    for sampled in (False, True):
        mine = [c for c in calls if c["sampled"] == sampled]
        if not mine:
            continue
        pairs = [(ctx, out, n) for c in mine for ctx, out, n in zip(c["contexts"], c["completions"], c["chosen"])]
        kept = sum(n for _, _, n in pairs)
        for k in (0, 1, 2, 3, 4, 8):
            steps = sum(drafted_steps(ctx, out, n, k) for ctx, out, n in pairs)
            click.echo(f"| {'sampled' if sampled else 'greedy'} ({len(pairs)}) | {k} | {kept:,} | {steps:,} | "
                       f"{kept / steps:.2f} | {steps * (1 + k) / kept:.2f} |")

    click.echo("\n**Cells attended per row** (refilled calls of more than one request)\n")
    click.echo("| call | requests | order | rows | cells attended per row | needed | masked share |")
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
            click.echo(f"| {n} {'sampled' if call['sampled'] else 'greedy'} | {size} | {name} | {rows:,} | "
                       f"{attended / rows:.0f} | {needed / rows:.0f} | {1 - needed / attended:.2f} |")


if __name__ == "__main__":
    main()
