"""The study-environment contract: everything the runner, the quant check and the bench ask of an environment.

An environment is bound to its data folder and reads it once. It builds items, judges a model's text against a
source record (`evaluate` -> a uniform `Outcome`), says whether a text repeats the failed action, turns a model's
own failure into an item, and describes how its harness reports an outcome (`Records`). The conditions' contexts
are built from those descriptions generically (fastscore.study.data.conditions), so no caller knows an environment's
internals.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fastscore.decode import ACTION_DONE, END_OF_TURN, ActionDone
from fastscore.errors import DataError
from fastscore.records import Message
from fastscore.study.data.items import Item, Skipped


@dataclass(frozen=True)
class Outcome:
    """A model's text judged against a source record: `ok` is success; `message` is what the harness printed."""

    ok: bool
    message: str
    kind: str  # the environment's own classification (a rejection kind, a test status)
    native: Any = field(default=None, compare=False, repr=False)  # the environment's own record of the run


@dataclass(frozen=True)
class Records:
    """How the harness reports on an action: who speaks (`role`) and the texts of each record condition."""

    role: str  # "tool" for tool results, "user" for a test harness
    failure_prefix: str  # before the error message in the `after` record
    neutral: str
    dont_repeat: str
    dont_repeat_separator: str  # between the failure report and the dont_repeat instruction


class StudyEnv(abc.ABC):
    name: ClassVar[str]
    max_new_tokens: ClassVar[int]  # greedy token cap (also the length of the model's own attempt, on policy)
    # How the seeded items' failure kinds are drawn, in one sentence (config.json and the report state it); None: the
    # environment states no rule.
    seeded_mix: ClassVar[str | None] = None
    records: ClassVar[Records]

    def __init__(self, data_dir: Path, progress: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.progress = progress
        self._sources: dict[str, Any] | None = None
        self._outcomes: dict[tuple[str, str], Outcome] = {}

    # --- what an environment implements ---

    @abc.abstractmethod
    def load_sources(self) -> list[Any]:
        """Every source record of the data folder, in file order (DataError naming file and line if malformed)."""

    @abc.abstractmethod
    def source_id(self, source: Any) -> str:
        """The record's id as items carry it (Item.source_id)."""

    @abc.abstractmethod
    def build_items(self, limit: int, seed: int) -> tuple[list[Item], list[Skipped]]:
        """Deterministic seeded items (the first `limit` usable sources in the seed's order) and the sources
        passed over, with reasons."""

    @abc.abstractmethod
    def judge(self, source: Any, text: str) -> Outcome:
        """Run or check a model's text against the source record."""

    @abc.abstractmethod
    def failure_item(self, source: Any, text: str, outcome: Outcome, seed: int) -> Item:
        """An item whose failed action is the model's own `text`; ValueError if it cannot be one."""

    @abc.abstractmethod
    def success_message(self, item: Item) -> str:
        """What the harness prints when the action succeeds (the `success` counterfactual)."""

    def native_tools(self, item: Item) -> Any:
        """The item in a chat template's native tool format (a NativeItem; the sensitivity check); ValueError with
        the reason where the environment's actions have no such form."""
        raise ValueError(f"{self.name} actions are programs, not tool calls")

    def finished_action(self, text: str, stopped_by: str) -> bool:
        """Is a model's attempt a finished action? By default: it ended its turn or its action_done rule held (not
        cut off at the token cap)."""
        return stopped_by in (END_OF_TURN, ACTION_DONE)

    def action_done(self) -> ActionDone | None:
        """The rule by which greedy decoding may stop once the action is written (see fastscore.decode): only where
        nothing the model writes after it can change a metric. By default none: decode to end-of-turn or the cap."""
        return None

    def same_action(self, text: str, failed_action: str) -> bool:
        """Does a completion reproduce the failed action? Text equality up to surrounding whitespace, as the
        decoder's ban compares."""
        return text.strip() == failed_action.strip()

    def reference_actions(self) -> list[str]:
        """Every usable source's reference answer in the canonical action form (the data a token cap derives
        from: fastscore.study.data.caps). By default none: the environment's cap is its constant."""
        return []

    def repeats_failure(self, item: Item, text: str) -> bool:
        """Does a completion repeat the failed action in meaning (the study's semantic repeat)? By default the
        environment's same_action; environments override it with what "the same action" means to their harness."""
        return self.same_action(text, item.failed_action)

    def may_repeat(self, item: Item) -> Callable[[str], bool] | None:
        """A predicate on a completion's start: could a completion that starts so still repeat the failed action in
        meaning (repeats_failure)? A sampled completion stops once it can repeat it neither so nor token for token
        (its two counts are all the study keeps of it). None, the default: the environment cannot tell from a start
        (MBPP runs the program), and samples decode to their end."""
        return None

    @classmethod
    def isolation(cls, mode: str) -> contextlib.AbstractContextManager:
        """The context in which this environment runs model-written code under isolation `mode`; an environment
        that runs none needs nothing (it raises before any model loads if the mode cannot be had)."""
        return contextlib.nullcontext()

    @classmethod
    def isolation_note(cls, mode: str) -> str | None:
        """What a report must say when `mode` leaves this environment's verdicts without isolation."""
        return None

    # --- provided on top ---

    def sources(self) -> dict[str, Any]:
        """Source records by id, read once per environment object."""
        if self._sources is None:
            self._sources = {self.source_id(s): s for s in self.load_sources()}
        return self._sources

    def source(self, source_id: str) -> Any:
        try:
            return self.sources()[source_id]
        except KeyError:
            raise DataError(f"{self.name}: no source record {source_id!r} in {self.data_dir}") from None

    def evaluate(self, source_id: str, text: str) -> Outcome:
        """judge() of the text against the source, each distinct (source, text) run once."""
        key = (source_id, text)
        if key not in self._outcomes:
            self._outcomes[key] = self.judge(self.source(source_id), text)
        return self._outcomes[key]

    def item_from_failure(self, source_id: str, text: str, outcome: Outcome, seed: int) -> Item:
        return self.failure_item(self.source(source_id), text, outcome, seed)

    def context_messages(self, item: Item) -> tuple[Message, ...]:
        """The (system, user) context every condition starts from."""
        return (Message("system", item.system), Message("user", item.task))

    def failure_report(self, item: Item) -> str:
        return self.records.failure_prefix + item.error_message
