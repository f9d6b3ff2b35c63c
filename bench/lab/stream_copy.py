"""What a whole-stream KV copy costs the decoding step it precedes.

Greedy decoding on KV streams shares a prefix by copying a whole stream (`llama_memory_seq_cp` across streams, run by
llama.cpp before the next decode): when a context joins from a stream that holds its prefix, and when a live stream
moves down into a finished one's hole (fastscore/backends/llamacpp_streams.py). Each copy moves every cell of the
stream, used or not. This starts `live` random contexts of `length` tokens in a refilling decoder of `slots` streams
sized for `longest` tokens (as the study's greedy stage does), then times its steps alternately as they are and with
`copies` whole-stream copies queued before them (into free streams, removed after the step).

    python -m fastscore.bench.lab.stream_copy
    python -m fastscore.bench.lab.stream_copy --threads 1 --live 16 --length 600 --longest 1024 --copies 4

Runs on the embedded model's llama.cpp f32 variant (the study's default).
"""

from __future__ import annotations

import statistics
import time

import click
import numpy as np


def copy_seconds(plain: list[float], copied: list[float], copies: int) -> float:
    """Seconds one copy adds: the median step with copies queued, less the median plain step, per copy."""
    return (statistics.median(copied) - statistics.median(plain)) / copies


@click.command()
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="llama.cpp threads (the study's lanes run 1 each).")
@click.option("--live", type=click.IntRange(1), default=16, show_default=True, help="Contexts stepping together.")
@click.option("--length", type=click.IntRange(2), default=600, show_default=True, help="Tokens per context.")
@click.option("--longest", type=click.IntRange(2), default=1024, show_default=True,
              help="Tokens the streams are sized for (rounded up to 256 cells).")
@click.option("--slots", type=click.IntRange(2), default=32, show_default=True, help="Streams in the decoder.")
@click.option("--copies", type=click.IntRange(1), default=4, show_default=True, help="Copies queued before a step.")
@click.option("--pairs", type=click.IntRange(2), default=20, show_default=True,
              help="Steps of each kind (alternating; the first of each not counted).")
def main(threads: int, live: int, length: int, longest: int, slots: int, copies: int, pairs: int) -> None:
    from fastscore.api import load

    if live + copies > slots:
        raise click.BadParameter(f"{live} live contexts and {copies} copies need more than {slots} slots",
                                 param_hint="--slots")
    if length + pairs * 2 > longest:
        raise click.BadParameter(f"{length} tokens and {2 * pairs} steps do not fit {longest}", param_hint="--longest")
    scorer = load(threads=threads).scorer
    try:
        backend = scorer.backend
        rng = np.random.default_rng(0)
        contexts = [rng.integers(100, backend.n_vocab - 100, length).tolist() for _ in range(live)]
        plain: list[float] = []
        copied: list[float] = []
        with backend.decoder(2 * pairs) as decoder:
            granted = decoder.reserve_slots(slots, longest=longest)
            if granted < live + copies:
                raise click.ClickException(f"the backend granted {granted} streams of {slots}")
            decoder.start(contexts)
            cells = decoder.room[1]
            L, memory = backend._L, decoder.groups[0].memory
            active, tokens = list(range(live)), [5] * live
            targets = range(live, live + copies)
            for step in range(2 * pairs):
                copy = step % 2 == 1
                if copy:
                    for target in targets:
                        L.llama_memory_seq_cp(memory, step % live, target, -1, -1)
                start = time.perf_counter()
                decoder.step(active, tokens)
                (copied if copy else plain).append(time.perf_counter() - start)
                if copy:
                    for target in targets:
                        L.llama_memory_seq_rm(memory, target, -1, -1)
    finally:
        scorer.close()
    plain, copied = plain[1:], copied[1:]
    per_copy = copy_seconds(plain, copied, copies)
    click.echo(f"{live} contexts of {length} tokens in {slots} streams of {cells} cells, {threads} thread(s)")
    click.echo(f"step: {statistics.median(plain) * 1e3:.1f} ms; with {copies} whole-stream copies queued: "
               f"{statistics.median(copied) * 1e3:.1f} ms; one copy: {per_copy * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
