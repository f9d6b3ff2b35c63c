"""The study's model opened: one scorer, or lanes of several that share out --threads (stages/lanes.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from fastscore.study.stages.lanes import Lanes

if TYPE_CHECKING:
    from fastscore.study.runner import StudyConfig


def model_selection(config: StudyConfig):
    """The study's model, checked (fastscore.selection); nothing is loaded."""
    from fastscore.selection import ModelSelection

    return ModelSelection.resolve(config.model, config.backend, config.quant, hf_path=config.hf_path,
                                  threads=config.threads)


def open_scorer(config: StudyConfig, progress: bool):
    # imports a backend: only when a study actually runs
    return model_selection(config).open(progress=progress, include_end_of_turn=config.include_end_of_turn)


DEFAULT_LANES = 2  # on 2 cores, 2 lanes of 1 thread decode 1.14x faster than 1 of 2 (docs/performance.md, "Lanes")


def lane_plan(config: StudyConfig) -> tuple[int, int | None]:
    """(lanes, threads of each): --threads shared out among --lanes. One lane keeps --threads as given (None: the
    backend's default). Without --lanes, several lanes only on a backend whose results do not depend on its threads
    (llama.cpp): the rows must not depend on the machine's core count."""
    from fastscore.backends import backend_class

    total = config.threads if config.threads is not None else os.cpu_count() or 1
    if config.lanes is not None:
        lanes = min(config.lanes, total)  # a lane has at least one of the threads asked for
    else:
        lanes = min(DEFAULT_LANES, total) if backend_class(config.backend).threads_adjustable else 1
    if lanes == 1:
        return 1, config.threads
    return lanes, max(total // lanes, 1)


def open_lanes(config: StudyConfig, progress: bool) -> Lanes:
    lanes, threads = lane_plan(config)
    per_lane = replace(config, threads=threads)
    scorers: list = []
    try:
        for _ in range(lanes):
            scorers.append(open_scorer(per_lane, progress))
    except BaseException:
        for scorer in scorers:
            scorer.close()
        raise
    return Lanes(scorers)
