"""Run the study end to end: build items, score every condition's candidate set, decode greedily, summarise, report.

Each stage shows a progress bar with ETA and is timed; one more bar counts the whole run's item-stages, so its ETA
covers the stages still to come (fastscore.study.stages.progress). Work is persisted per item (see stages/store.py),
so a killed run resumes with `resume=True` where it stopped. Several items go into one scorer call so the engine shares the common
prefixes of all their conditions and candidates; identical requests of one item (clean_retry renders to before's
messages, ban scores after's candidate set) are sent once. Calls hold fixed chunks of the item list, so a resumed
run makes exactly the calls an uninterrupted one makes and reproduces its numbers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fastscore import provenance
from fastscore.errors import DataError
from fastscore.outputs import OutDirLock
from fastscore.registry import default_model
from fastscore.study.data.conditions import CONDITIONS
from fastscore.study.data.datafile import default_data_dir
from fastscore.study.data.envs import ENVS, env_class, items_for_envs, open_envs, seeded_mix_rules
from fastscore.study.data.envs.base import StudyEnv
from fastscore.study.data.items import Item, Skipped
from fastscore.study.analysis.metrics import read_score_rows, summarize
from fastscore.study.analysis.redactions import attach_redactions
from fastscore.study.stages.onpolicy import KnownAttempts, ModelFailureBuilder
from fastscore.study.stages.progress import RunProgress, SourcePlan
from fastscore.study.stages.decode import DecodePlan, greedy_stage
from fastscore.study.stages.lanes import Lanes
from fastscore.study.stages.score import score_stage
from fastscore.study.analysis.sensitivity import attach_sensitivity
from fastscore.study.stages.sensitivity import sensitivity_stage
from fastscore.study.stages.store import SCORES_FILE, StudyStore
from fastscore.study.sources import StudyOutcome, combine_sources
from fastscore.study.opening import model_selection, open_lanes

log = logging.getLogger(__name__)

# An environment's seeded items in order and the sources passed over (what StudyEnv.build_items returns).
SeededItems = tuple[list[Item], list[Skipped]]

FAILURE_SOURCES = ("seeded", "model")
BOTH = "both"  # every failure source, each in its own subfolder of --out, reported side by side
RETRIES = 2  # samples per on-policy item under each record and the clean retry (docs/study.md, "Repeats")
# Items per env of `make study`, sized so both envs, all conditions and greedy decoding finish in about ten minutes
# on the 2-core study machine. Measured with nothing else running: 20 per env took 466 s (scoring 217 s, greedy
# 242 s; 512 s before the scorer's group budget), 8 per env 205 s. Other jobs on the same 2 cores slow it roughly
# threefold (8 per env took 655 s then).
# The run prints its measured time.
DEFAULT_LIMIT = 20


@dataclass(frozen=True)
class StudyConfig:
    model: str = field(default_factory=default_model)
    backend: str = "llamacpp"
    quant: str | None = None  # None: the model's default on the backend (fastscore.selection.default_quant_of)
    envs: tuple[str, ...] = ENVS
    limit: int | None = DEFAULT_LIMIT  # items per environment; None: every usable item
    seed: int = 0
    # "seeded": mutations of the ground truth; "model": the model's own failed attempts; "both": each in turn
    failures: str = BOTH
    retries: int = RETRIES  # samples per on-policy item and record (temperature 1.0, seeded)
    include_end_of_turn: bool = True  # score the end-of-turn token after the action (False: the action alone)
    out_dir: Path = Path("study-out")
    data_dir: Path = field(default_factory=default_data_dir)
    resume: bool = False
    n_boot: int = 2000
    # Greedy token cap; None: each environment's own (StudyEnv.max_new_tokens). Each item decodes at most twice its
    # longest candidate (stages.decode.greedy_budget), so the caps rarely bind; they are also the length of the
    # model's own attempt under --failures model.
    max_new_tokens: int | None = None
    hf_path: Path | None = None
    threads: int | None = None  # CPU threads of the whole run, shared by its lanes; None: the machine's cores
    # Copies of the model that run the greedy stage's decoder calls side by side, each on threads / lanes threads
    # (fastscore.study.stages.lanes). None: 2 where there are 2 threads or more and the backend's results do not
    # depend on its threads (llama.cpp), else 1. The results do not depend on it, so a resumed run may use another.
    lanes: int | None = None
    sandbox: str = "bwrap"  # MBPP programs: "bwrap" (isolated) or "rlimits" (not isolated; the report says so)
    # Only the seeded items [start, stop) of each environment's order (under model failures: those of them the model
    # fails): a sweep's shard. None: the first `limit` items.
    window: tuple[int, int] | None = None
    # Harness-realism checks (fastscore.study.stages.sensitivity): extra scoring after the study's stages, reported as
    # changes on the headline. Off by default: `make study` turns them on (--sensitivity).
    sensitivity: bool = False

    def __post_init__(self) -> None:
        if self.quant is None:
            from fastscore.selection import default_quant_of

            object.__setattr__(self, "quant", default_quant_of(self.model, self.backend))

    def new_tokens(self, env: str) -> int:
        return self.max_new_tokens if self.max_new_tokens is not None else env_class(env).max_new_tokens

    def result_settings(self) -> dict[str, Any]:
        """The settings that determine the results: a resumed run must use the same ones (config.json)."""
        return {
            "model": self.model,
            "backend": self.backend,
            "quant": self.quant,
            "envs": list(self.envs),
            "limit": self.limit,
            "seed": self.seed,
            "failures": self.failures,
            "retries": self.retries,
            "include_end_of_turn": self.include_end_of_turn,
            "data_dir": str(Path(self.data_dir).resolve()),
            "max_new_tokens": {env: self.new_tokens(env) for env in self.envs},
            "hf_path": None if self.hf_path is None else str(Path(self.hf_path).resolve()),
            "window": None if self.window is None else list(self.window),
            "sensitivity": self.sensitivity,
            # How seeded failure kinds are drawn: items built under another rule must not be resumed as this one's.
            "seeded_failure_mix": None if self.failures == "model" else seeded_mix_rules(self.envs),
        }


class StageTimer:
    """Seconds per stage and, where a token counter is given, the tokens the model computed in it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.tokens: dict[str, int] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str, tokens: Callable[[], int] | None = None) -> Iterator[None]:
        log.info("stage: %s", stage)
        start = time.perf_counter()
        first = tokens() if tokens is not None else 0
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
            if tokens is not None:
                self.tokens[stage] = self.tokens.get(stage, 0) + tokens() - first


def check_config(config: StudyConfig) -> None:
    """Typed errors for bad settings and missing data, before any model is loaded or --out is touched."""
    model_selection(config)
    unknown = [env for env in config.envs if env not in ENVS]
    if unknown or not config.envs:
        raise DataError(f"unknown environment(s) {unknown or config.envs}: choose from {', '.join(ENVS)}")
    if config.failures not in (*FAILURE_SOURCES, BOTH):
        raise DataError(f"--failures must be one of {', '.join((*FAILURE_SOURCES, BOTH))} (got {config.failures!r})")
    if config.limit is not None and config.limit < 1:
        raise DataError(f"--limit must be at least 1 or 'all' (got {config.limit})")
    if config.retries < 0:
        raise DataError(f"--retries must be at least 0 (got {config.retries})")
    if config.window is not None and not 0 <= config.window[0] < config.window[1]:
        raise DataError(f"an item window needs 0 <= start < stop (got {config.window})")
    if config.window is not None and config.failures == BOTH:
        raise DataError("an item window (a sweep shard) runs one failure source, not both")
    if config.lanes is not None and config.lanes < 1:
        raise DataError(f"--lanes must be at least 1 (got {config.lanes})")
    if config.lanes is not None and config.lanes > 1:
        from fastscore.backends import backend_class

        if not backend_class(config.backend).threads_adjustable:
            raise DataError(f"--lanes {config.lanes} needs a backend whose results do not depend on its threads "
                            f"(llamacpp); {config.backend} runs one lane")
    if config.n_boot < 1:
        raise DataError(f"n_boot must be at least 1 (got {config.n_boot})")
    if config.max_new_tokens is not None and config.max_new_tokens < 1:
        raise DataError(f"--max-new-tokens must be at least 1 (got {config.max_new_tokens})")
    data = Path(config.data_dir)
    if not data.is_dir():
        raise DataError(f"study data folder {data} not found (resolved: {data.resolve()}); pass --data DIR")


def exact_type(config: StudyConfig) -> bool:
    """Is the run's type batch-invariant full precision, so that a completion is the same bits in any batch or lane
    (a quantised llama.cpp type's argmax moves with the batch)?"""
    from fastscore.variants import FULL_PRECISION

    return FULL_PRECISION.get(config.backend) == config.quant


def decode_plan(config: StudyConfig, backend=None) -> DecodePlan:
    """Greedy completions come off the argmax chain only where that is exact: an exact type (exact_type) scoring
    the end-of-turn token (else the chain does not say where greedy decoding stops). Samples only for the model's
    own failures. A completion is the same bits in any call (DecodePlan.exact) on an exact type on a `backend` whose
    steps give a prefill's bits."""
    return DecodePlan(argmax_chain=exact_type(config) and config.include_end_of_turn,
                      retries=config.retries if config.failures == "model" else 0, seed=config.seed,
                      exact=exact_type(config) and backend is not None and backend.steps_match_prefill)


def _seeded_source(config: StudyConfig, seeded: Mapping[str, SeededItems] | None
                   ) -> Callable[[StudyEnv], Callable[[int | None], SeededItems]]:
    """env -> (limit -> the first `limit` seeded items and the sources passed over): built by the environment, or
    taken from the list a sweep's driver built once (the sources passed over are then those of its whole build)."""

    def of(env: StudyEnv) -> Callable[[int | None], SeededItems]:
        if seeded is None or env.name not in seeded:
            return lambda limit: env.build_items(limit, config.seed)
        items, skipped = seeded[env.name]
        if any(item.env != env.name for item in items):
            raise DataError(f"the seeded items given for {env.name} hold items of another environment")
        return lambda limit: (list(items if limit is None else items[:limit]), list(skipped))

    return of


def _build_items(config: StudyConfig, envs: Mapping[str, StudyEnv], scorer, progress: bool,
                 seeded: Mapping[str, SeededItems] | None = None, known: KnownAttempts | None = None
                 ) -> tuple[list[Item], list[Skipped]]:
    source = _seeded_source(config, seeded)
    if config.failures == "seeded":
        if config.window is None:
            return items_for_envs(envs, config.limit, config.seed, build=lambda env: source(env)(config.limit))
        start, stop = config.window

        def seeded_window(env: StudyEnv) -> tuple[list[Item], list[Skipped]]:
            items, skipped = source(env)(stop)
            # The sources passed over belong to the whole order, not to a window: the first window counts them.
            return items[start:stop], skipped if start == 0 else []

        return items_for_envs(envs, config.limit, config.seed, build=seeded_window)

    def own_failures(env: StudyEnv) -> tuple[list[Item], list[Skipped]]:
        builder = ModelFailureBuilder(env, scorer, config.seed, config.new_tokens(env.name), seeded=source(env),
                                      known=known)
        if config.window is not None:
            return builder.build_window(*config.window, progress=progress)
        return builder.build(config.limit, progress)

    return items_for_envs(envs, config.limit, config.seed, build=own_failures)


def run_study(
    config: StudyConfig,
    *,
    progress: bool = False,
    after_item: Callable[[str, str], None] | None = None,
    scorer=None,
    report: bool = True,
    items: Mapping[str, SeededItems] | None = None,
) -> StudyOutcome:
    """Run (or resume) the study described by `config`; `after_item(stage, item_id)` is called after each item is
    stored (a hook for progress reporting and for tests that interrupt a run).

    `scorer`: an open scorer of the config's model and variant to use (and leave open) instead of loading one, so a
    sweep worker loads its model once for many shards. `report=False` stops once the rows are stored (no summary,
    report or plots): a shard may hold no item, and its sweep summarises whole cells. `items`: per environment, its
    seeded items in order and the sources passed over, as `StudyEnv.build_items` makes them (a sweep builds them once
    for all its shards); the run takes its window (or first `limit`) from them instead of building them again.
    """
    started = time.perf_counter()
    check_config(config)
    with OutDirLock(Path(config.out_dir)), contextlib.ExitStack() as isolated:
        for name in config.envs:  # before any model loads: a missing sandbox stops the run here
            isolated.enter_context(env_class(name).isolation(config.sandbox))
        run_bar = isolated.enter_context(contextlib.closing(RunProgress(progress)))
        for source in FAILURE_SOURCES if config.failures == BOTH else (config.failures,):
            run_bar.plan(source, _target_items(config), _source_plan(config, source))
        if config.failures != BOTH:
            return _run_locked(config, started, progress, after_item, scorer, report, items, run_bar)
        # Each source is a complete study in its own subfolder (resumable on its own); the top folder gets the
        # side-by-side report and a summary keyed by source.

        outcomes = {}
        # The seeded source's `before` completions, for the model's own attempts at the same sources (exact types).
        known = KnownAttempts() if exact_type(config) else None
        for source in FAILURE_SOURCES:
            sub = replace(config, failures=source, out_dir=Path(config.out_dir) / source)
            log.info("failure source %s -> %s", source, sub.out_dir)
            outcomes[source] = _run_locked(sub, time.perf_counter(), progress, after_item, scorer, report, items,
                                           run_bar, known)
        return combine_sources(config, outcomes, time.perf_counter() - started)


def _target_items(config: StudyConfig) -> int:
    """Items a source aims at before they are built (0: unknown until built, i.e. every usable item)."""
    if config.window is not None:
        return (config.window[1] - config.window[0]) * len(config.envs)
    return 0 if config.limit is None else config.limit * len(config.envs)


def _source_plan(config: StudyConfig, source: str) -> SourcePlan:
    return SourcePlan(builds_items=source == "model", sensitivity=config.sensitivity)


def _run_locked(config: StudyConfig, started: float, progress: bool,
                after_item: Callable[[str, str], None] | None, given_scorer, report: bool,
                seeded: Mapping[str, SeededItems] | None, run_bar: RunProgress,
                known: KnownAttempts | None = None) -> StudyOutcome:
    timer = StageTimer()
    source, shape = config.failures, _source_plan(config, config.failures)
    hooked = run_bar.hook(source, after_item)
    built = int(shape.builds_items)  # item-stages each item is through once its items exist
    store = StudyStore(Path(config.out_dir))
    store.check_resume(config.result_settings(), config.resume)
    envs = open_envs(config.envs, Path(config.data_dir), progress=progress)
    with timer("load model"):
        lanes = Lanes((given_scorer,)) if given_scorer is not None else open_lanes(config, progress)
    plan = decode_plan(config, lanes.first.backend)
    if not plan.exact:
        known = None  # an attempt begun with a known completion could differ from decoding it again (KnownAttempts)
    try:
        # Only now, with every setting valid and the model loaded, may the previous run's files be replaced.
        resumed = store.start(config.result_settings(), config.resume, provenance.produced_by(lanes.first))
        computed = lanes.computed_tokens
        with timer("build items", computed):
            stored = store.load_items() if resumed else None
            if stored is None:
                with lanes.solo() as scorer:
                    items, skipped = _build_items(config, envs, scorer, progress, seeded, known)
                store.save_items(items, skipped)
            else:
                items, skipped = stored
                log.info("resume: reusing the %d stored items", len(items))
        run_bar.plan(source, len(items), shape)
        run_bar.plan_unknown(len(items))  # every usable item: the other source's guess until it is built
        run_bar.settle(source, len(items), built)
        n_resumed = len(store.scores(rows_per_item=len(CONDITIONS)).load())
        with timer("score candidate sets", computed):
            # Scoring runs on every thread in one lane: its big trie groups use two threads well (1.8-1.9x from 1 to
            # 2 threads, docs/performance.md "Threads and cores"), so lanes would gain little there.
            with lanes.solo() as scorer:
                score_stage(store, scorer, envs, items, progress=progress, after_item=hooked)
        run_bar.settle(source, len(items), built + 1)
        with timer("greedy decoding", computed):
            greedy_stage(store, lanes, envs, items, config.new_tokens, plan, progress=progress,
                         after_item=hooked, known=known)
        run_bar.settle(source, len(items), built + 2)
        if config.sensitivity:
            with timer("sensitivity checks", computed):
                with lanes.solo() as scorer:
                    sensitivity_stage(store, scorer, envs, items, progress=progress, after_item=hooked)
            run_bar.settle(source, len(items), built + 3)
        weights = lanes.first.weights_note
    finally:
        if given_scorer is None:
            for scorer in lanes.scorers:
                scorer.close()
    errors = [r for records in store.item_errors().load().values() for r in records]
    if not report:  # a sweep shard: the sweep summarises its cells from the shards' rows
        counts = {env: sum(item.env == env for item in items) for env in config.envs}
        files = tuple(store.path(name) for name in store.existing_files())
        return StudyOutcome(Path(config.out_dir), counts, len(errors), n_resumed, {}, dict(timer.seconds),
                            time.perf_counter() - started, files)
    return summarise_and_report(config, store, items, skipped, weights, timer, errors=errors, resumed=resumed,
                                started=started, n_resumed=n_resumed)


def summarise_and_report(config: StudyConfig, store: StudyStore, items: list[Item], skipped: list[Skipped],
                         weights: str, timer: StageTimer, *, errors: list[dict[str, Any]], resumed: bool,
                         started: float, n_resumed: int) -> StudyOutcome:
    """The study's analysis of a folder whose rows are stored: summary.json, report.md and plots. A sharded run
    (fastscore.study.shards.merge) feeds the rows of all its shards through here, as one run of the same config."""
    with timer("summarise"):
        rows = read_score_rows(store.path(SCORES_FILE))
        summary = summarize(rows, seed=config.seed, n_boot=config.n_boot)
        attach_redactions(summary, items)
        if config.sensitivity:
            attach_sensitivity(summary, store, config.seed, config.n_boot)
        summary_path = store.write_summary(summary)
    plots, report_files = _write_report(config, store, rows, summary, weights, skipped, errors, timer, resumed)
    total = time.perf_counter() - started
    n_items = {env: s["n_items"] for env, s in summary.items()}
    files = tuple(store.path(name) for name in store.existing_files()) + tuple(plots)
    log.info("study finished in %.1f s", total)
    return StudyOutcome(Path(config.out_dir), n_items, len(errors), n_resumed, summary, dict(timer.seconds),
                        total, tuple(dict.fromkeys(files + (summary_path, *report_files))))


def _write_report(config, store, rows, summary, weights, skipped, errors, timer, resumed):
    with timer("report and plots"):
        from fastscore.deps import has_extra
        from fastscore.study.report.plots import write_plots
        from fastscore.study.report.document import write_report
        from fastscore.study.report.meta import report_meta

        # before the report, which links the plots; without matplotlib (announced at the start) there are none
        plots = write_plots(rows, summary, Path(config.out_dir)) if has_extra("study") else []
        meta = report_meta(config, weights, skipped, errors, timer.seconds, resumed, timer.tokens)
        meta["greedy_from"] = ("the scoring pass's argmax chain where a candidate's chain is complete (exact type), "
                               "decoded otherwise" if decode_plan(config).argmax_chain else "decoded")
        meta["provenance"] = store.provenance()
        report = write_report(summary, Path(config.out_dir), meta)
    return plots, (report,)
