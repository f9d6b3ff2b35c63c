"""One progress bar over a whole study run, so its ETA covers the stages still to come, not only the current one.

Each stage keeps its own bar (how far that stage is); this one counts item-stages: every item of every failure
source once per stage it goes through (building an on-policy item, scoring, greedy decoding, the sensitivity
checks). Before a source's items exist the bar plans on its target (`limit` per environment); once they are built
the plan is their real number. A resumed run's items already done in a stage are counted when that stage ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm

AfterItem = Callable[[str, str], None]


@dataclass(frozen=True)
class SourcePlan:
    """What one failure source's run goes through: its item-stages per item."""

    builds_items: bool  # on-policy: each item is built from a decoded attempt (one item-stage of its own)
    sensitivity: bool

    @property
    def stages_per_item(self) -> int:
        return 2 + int(self.builds_items) + int(self.sensitivity)


class RunProgress:
    """The run-level bar: `plan` each source (estimated, then exact), `hook` the stages' after_item, `settle` each
    stage's end."""

    def __init__(self, enabled: bool) -> None:
        self.bar = tqdm(total=0, desc="study, all stages", unit="item-stage", disable=not enabled)
        self.planned: dict[str, int] = {}
        self.shapes: dict[str, SourcePlan] = {}
        self.done: dict[str, int] = {}

    def plan(self, source: str, n_items: int, shape: SourcePlan) -> None:
        """Expect n_items items in `source` (a target before they are built, their number after)."""
        self.planned[source] = n_items * shape.stages_per_item
        self.shapes[source] = shape
        self.done.setdefault(source, 0)
        self._show()

    def plan_unknown(self, n_items: int) -> None:
        """Expect n_items items in each source whose number is still unknown (planned 0): with every usable item
        wanted, the items one source built are the best guess for the next."""
        for source, units in list(self.planned.items()):
            if units == 0:
                self.plan(source, n_items, self.shapes[source])

    def hook(self, source: str, after_item: AfterItem | None) -> AfterItem:
        """A stage's after_item that also advances this bar."""

        def advance(stage: str, item_id: str) -> None:
            self.done[source] = self.done.get(source, 0) + 1
            self._show()
            if after_item is not None:
                after_item(stage, item_id)

        return advance

    def settle(self, source: str, n_items: int, stages_done: int) -> None:
        """A stage ended: every item of the source is through `stages_done` stages, resumed ones included."""
        self.done[source] = n_items * stages_done
        self._show()

    def _show(self) -> None:
        self.bar.total = max(sum(self.planned.values()), sum(self.done.values()))
        self.bar.n = sum(self.done.values())
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
