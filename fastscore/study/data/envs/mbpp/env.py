"""The MBPP program-repair environment: items whose failed action is a program that really fails its tests.

Action format (fixed): the whole program in one fenced block, exactly "```python\\n<code>\\n```", where <code> has
\\r\\n normalised to \\n, trailing whitespace stripped from every line and no leading/trailing blank lines.

Failed actions are seeded single-edit mutants of the reference solution (see mbpp_mutations), kept only if running
them against the task's tests in the sandbox fails. Each task draws from `random.Random(f"{seed}:{task_id}")`, so an
item does not depend on which other tasks are in the study.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tqdm import tqdm

from fastscore.decode import ActionDone
from fastscore.errors import DataError
from fastscore.jsonl import read_json_objects
from fastscore.study.data.hygiene import check_description, redact
from fastscore.study.data.envs.base import Outcome, Records, StudyEnv
from fastscore.study.data.items import Item, Skipped
from fastscore.study.data.envs.mbpp.describe import WORDING, describe_failure
from fastscore.study.data.envs.mbpp.mutations import Mutant, seeded_mutants
from fastscore.study.data.envs.mbpp.isolation import rlimits_note
from fastscore.study.data.envs.mbpp.sandbox import RunOutcome, SandboxLimits, run_program, use_isolation

log = logging.getLogger(__name__)

ENV = "mbpp"
DATA_FILE = "mbpp.jsonl"
EXTRA_MUTANTS = 2  # failing mutants shown in the candidate set besides the failed program and the reference
N_CANDIDATES = 2 + EXTRA_MUTANTS
WORKERS = 2
# Mutants run under a short, fixed CPU-time limit: references finish in milliseconds, and an infinite-loop mutant
# would otherwise hold a worker for the full default timeout. The limit is on CPU time, not wall time, because a
# program's CPU time does not grow with machine load: under a 2 s wall limit a loaded machine turned an ordinary
# AssertionError mutant into a "did not finish" one and so changed which mutant an item kept. The generous wall
# limit only catches programs that block without computing.
MUTANT_LIMITS = SandboxLimits(timeout_s=30.0, cpu_s=2)
EVAL_LIMITS = SandboxLimits()

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Solve the user's programming task with a Python program that passes "
    "the given tests. Answer with the complete program in a single fenced code block that starts with ```python "
    "and ends with ```, and nothing else."
)
AFTER_PREFIX = "Running the tests failed:\n"
SUCCESS_MESSAGE = "All tests passed."
NEUTRAL_MESSAGE = "Program received."
DONT_REPEAT_INSTRUCTION = "Do not repeat the failed program."

# (language, code, closing fence or "" where the block runs to the end of the text)
_FENCED = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(\n[ \t]*```|\Z)", re.DOTALL)
_PYTHON = ("python", "py", "python3")
_CLOSED_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n.*?\n[ \t]*```", re.DOTALL)
_REQUIRED_KEYS = {"text": str, "code": str, "task_id": int, "test_list": list}

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class MbppSource:
    task_id: int
    text: str
    code: str  # the reference solution as stored (may have \r\n and trailing spaces)
    test_list: tuple[str, ...]
    test_setup_code: str = ""
    challenge_test_list: tuple[str, ...] = ()

    @property
    def reference(self) -> str:
        return normalize_program(self.code)

    @property
    def tests(self) -> tuple[str, ...]:
        return tuple(t.replace("\r\n", "\n").strip() for t in self.test_list)


def normalize_program(code: str) -> str:
    lines = [line.rstrip() for line in code.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def format_program(code: str) -> str:
    """The canonical action text for a program."""
    return f"```python\n{normalize_program(code)}\n```"


def extract_program(action_text: str) -> str:
    """The program in a model's answer: the first ```python block (else the first fenced block), else the raw text.

    An unterminated fence (a generation cut off at the token limit) yields everything after the opening line.
    """
    text = action_text.replace("\r\n", "\n")
    blocks = _FENCED.findall(text)
    chosen = next((code for lang, code, _close in blocks if lang.lower() in _PYTHON), None)
    if chosen is None and blocks:
        chosen = blocks[0][1]
    return normalize_program(chosen if chosen is not None else text)


def program_written(text: str) -> bool:
    """Has the answer closed a ```python block? Then extract_program's choice is final: the blocks up to it are
    closed and stay as they are whatever follows, and the first python block among them is the program."""
    blocks = _FENCED.findall(text.replace("\r\n", "\n"))
    return any(close and lang.lower() in _PYTHON for lang, _code, close in blocks)


def _source_from_json(raw: object, path: Path, line_no: int) -> MbppSource:
    if not isinstance(raw, dict):
        raise DataError(f"{path}: line {line_no}: expected a JSON object, got {type(raw).__name__}")
    for key, kind in _REQUIRED_KEYS.items():
        if not isinstance(raw.get(key), kind) or isinstance(raw.get(key), bool):
            raise DataError(f"{path}: line {line_no}: field {key!r} is missing or not a {kind.__name__}")
    if not all(isinstance(t, str) for t in raw["test_list"]) or not raw["test_list"]:
        raise DataError(f"{path}: line {line_no}: field 'test_list' must be a non-empty list of strings")
    setup = raw.get("test_setup_code", "")
    if not isinstance(setup, str):
        raise DataError(f"{path}: line {line_no}: field 'test_setup_code' is not a string")
    return MbppSource(
        task_id=raw["task_id"], text=raw["text"], code=raw["code"], test_list=tuple(raw["test_list"]),
        test_setup_code=setup, challenge_test_list=tuple(raw.get("challenge_test_list") or ()),
    )  # fmt: skip


def load_sources(data_dir: Path) -> list[MbppSource]:
    """Read data_dir/mbpp.jsonl; a missing file or a malformed line raises DataError naming the path and line."""
    path = Path(data_dir) / DATA_FILE
    sources, seen = [], set()
    for line_no, raw in read_json_objects(path):
        source = _source_from_json(raw, path, line_no)
        if source.task_id in seen:
            raise DataError(f"{path}: line {line_no}: duplicate task_id {source.task_id}")
        seen.add(source.task_id)
        sources.append(source)
    if not sources:
        raise DataError(f"{path}: no MBPP records")
    return sources


def _task_text(source: MbppSource) -> str:
    return f"{source.text.strip()}\n\nYour code should pass these tests:\n" + "\n".join(source.tests)


def _run(source: MbppSource, program: str, limits: SandboxLimits) -> RunOutcome:
    return run_program(program, source.tests, source.test_setup_code.replace("\r\n", "\n"), limits)


def _failing_mutants(
    source: MbppSource, rng: random.Random, want: int, exclude: Iterable[str] = ()
) -> list[tuple[Mutant, RunOutcome]]:
    """The first `want` mutants (in the seeded order) that fail their tests when run, skipping texts in `exclude`."""
    excluded = set(exclude)
    found = []
    for mutant in seeded_mutants(source.reference, rng):
        if mutant.text in excluded:
            continue
        outcome = _run(source, mutant.text, MUTANT_LIMITS)
        if not outcome.passed:
            found.append((mutant, outcome))
            if len(found) == want:
                break
    return found


def _description(program: str, outcome: RunOutcome, source: MbppSource) -> str:
    """Sized like what it replaces in the transcript: the failed action plus its error message."""
    return describe_failure(program, outcome, source.tests, len(format_program(program)) + len(outcome.message))


def _build_item(source: MbppSource, seed: int) -> Item | Skipped:
    reference = source.reference
    check = _run(source, reference, EVAL_LIMITS)
    if not check.passed:
        return Skipped(ENV, str(source.task_id), f"reference solution does not pass its tests ({check.message})")
    rng = random.Random(f"{seed}:{source.task_id}")
    failing = _failing_mutants(source, rng, 1 + EXTRA_MUTANTS)
    if not failing:
        reason = "no single-edit mutant of the reference fails the tests"
        if not seeded_mutants(reference, random.Random(0)):
            reason = "the reference has no mutation site (no operator, comparison, integer, index or return value)"
        return Skipped(ENV, str(source.task_id), reason)
    (mutant, outcome), extras = failing[0], failing[1:]
    mutation = {"kind": mutant.kind, "start": mutant.start, "end": mutant.end, "original": mutant.original,
                "replacement": mutant.replacement}
    try:
        return _item(source, f"{ENV}-{source.task_id}", mutant.text, outcome, mutant.kind, extras,
                     {"mutation": mutation})
    except ValueError as exc:
        return Skipped(ENV, str(source.task_id), str(exc))


def _item(source: MbppSource, item_id: str, program: str, outcome: RunOutcome, kind: str,
          extras: list[tuple[Mutant, RunOutcome]], meta: dict, shown: str | None = None) -> Item:
    """The item whose failed action is `program` (failing with `outcome`), shown as `shown` (default: in the
    canonical format); the candidate set is it, the reference and the extra failing mutants."""
    failed_action = format_program(program) if shown is None else shown
    reference = format_program(source.reference)
    candidates = (failed_action, reference, *(format_program(m.text) for m, _ in extras))
    if len(set(candidates)) != N_CANDIDATES:
        # Fewer failing mutants than needed: the set has a fixed size so P(repeat) means the same on every item.
        raise ValueError(f"only {len(set(candidates))} distinct candidates "
                         f"(the set has a fixed size of {N_CANDIDATES})")
    # The outline names the program's own functions and parameters: on the model's own programs those quote its
    # names, which are replaced by a marker (the error record, error_message, stays as the tests printed it).
    context = SYSTEM_PROMPT + "\n" + _task_text(source)
    description, redacted = redact(_description(program, outcome, source), failed_action, reference, context, WORDING)
    check_description(description, failed_action, reference, context, WORDING)
    return Item(
        env=ENV, item_id=item_id, source_id=str(source.task_id), system=SYSTEM_PROMPT, task=_task_text(source),
        failed_action=failed_action, error_message=outcome.message, failure_kind=kind, correct_actions=(reference,),
        candidates=candidates, description=description,
        meta={"status": outcome.status, "failing_test": outcome.failing_test, "description_redacted": redacted, **meta,
              "candidate_statuses": [outcome.status, "passed", *(o.status for _, o in extras)]},
    )


def _in_order(fn: Callable[[T], R], inputs: Iterable[T], workers: int) -> Iterator[R]:
    """fn over inputs on a small thread pool, yielded in input order; at most `workers` calls run ahead."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mbpp-build")
    pending: deque[Future[R]] = deque()
    it = iter(inputs)
    try:
        for x in it:
            pending.append(pool.submit(fn, x))
            if len(pending) >= workers:
                break
        while pending:
            head = pending.popleft()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(pool.submit(fn, nxt))
            yield head.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def build_items(data_dir: Path, limit: int | None, seed: int, sources: list[MbppSource] | None = None,
                progress: bool = False) -> tuple[list[Item], list[Skipped]]:
    """The first `limit` usable tasks in a seeded shuffled order, as items; the tasks passed over, with reasons."""
    sources = sorted(load_sources(data_dir) if sources is None else sources, key=lambda s: s.task_id)
    random.Random(f"{seed}:mbpp-order").shuffle(sources)
    items: list[Item] = []
    skipped: list[Skipped] = []
    if limit is not None and limit <= 0:
        return items, skipped
    with tqdm(total=limit or len(sources), desc="mbpp items", unit="item", leave=False, disable=not progress) as bar:
        for result in _in_order(lambda s: _build_item(s, seed), sources, WORKERS):
            if isinstance(result, Skipped):
                skipped.append(result)
                log.info("skipped mbpp task %s: %s", result.source_id, result.reason)
                continue
            items.append(result)
            bar.update(1)
            if len(items) == limit:
                break
    log.info("built %d mbpp items (%d tasks skipped)", len(items), len(skipped))
    return items, skipped


def evaluate(source: MbppSource, action_text: str) -> RunOutcome:
    """Run the program in a model's answer against the task's tests (on-policy failures)."""
    return _run(source, extract_program(action_text), EVAL_LIMITS)


def item_from_failure(source: MbppSource, action: str, outcome: RunOutcome, seed: int) -> Item:
    """An item whose failed action is the model's own failing answer (failure_kind "model").

    The failed action is `action` as given: the model's answer as it emitted it, up to where the harness cut it
    (fastscore.study.stages.onpolicy.emitted_action), so every record shows and every condition scores what the model
    wrote, not a re-rendering; it is judged by the program it contains. The other candidates are the reference and
    failing mutants of it in the canonical format, drawn as in build_items.
    """
    program = extract_program(action)
    if outcome.passed or program == source.reference:
        raise ValueError(f"mbpp task {source.task_id}: the program passed; only failures become items")
    rng = random.Random(f"{seed}:{source.task_id}")
    extras = _failing_mutants(source, rng, EXTRA_MUTANTS, exclude={program, source.reference})
    digest = hashlib.sha1(program.encode("utf-8")).hexdigest()[:8]
    return _item(source, f"{ENV}-{source.task_id}-model-{digest}", program, outcome, "model", extras, {},
                 shown=action)


class MbppEnv(StudyEnv):
    name = ENV
    # From the data (fastscore.study.data.caps, embedded tokenizer): the 974 reference programs' p99 is 239.3 tokens
    # (max 419); + 25% margin = 300 (cuts 0.2% of the references). tests/test_study_caps.py checks it.
    max_new_tokens = 300
    records = Records(role="user", failure_prefix=AFTER_PREFIX, neutral=NEUTRAL_MESSAGE,
                      dont_repeat=DONT_REPEAT_INSTRUCTION, dont_repeat_separator="\n\n")

    @classmethod
    def isolation(cls, mode: str):
        return use_isolation(mode)

    @classmethod
    def isolation_note(cls, mode: str) -> str | None:
        return rlimits_note() if mode == "rlimits" else None

    def load_sources(self) -> list[MbppSource]:
        return load_sources(self.data_dir)

    def source_id(self, source: MbppSource) -> str:
        return str(source.task_id)

    def build_items(self, limit: int | None, seed: int) -> tuple[list[Item], list[Skipped]]:
        return build_items(self.data_dir, limit, seed, sources=list(self.sources().values()), progress=self.progress)

    def judge(self, source: MbppSource, text: str) -> Outcome:
        run = evaluate(source, text)
        return Outcome(ok=bool(run.passed), message=run.message, kind=run.status, native=run)

    def failure_item(self, source: MbppSource, text: str, outcome: Outcome, seed: int) -> Item:
        return item_from_failure(source, text, outcome.native, seed)

    def success_message(self, item: Item) -> str:
        return SUCCESS_MESSAGE

    def finished_action(self, text: str, stopped_by: str) -> bool:
        """A closed fenced program is a finished action even if the model talked on after it: the item's failed
        action is the answer up to the harness's cut (onpolicy.emitted_action), its program that block's."""
        closed = _CLOSED_FENCE.search(text.replace("\r\n", "\n")) is not None
        return super().finished_action(text, stopped_by) or closed

    def action_done(self) -> ActionDone:
        """Decoding may stop one token after the answer closes a ```python block: what follows changes neither the
        program extracted (program_written) nor whether the model ended its turn right after the block (the
        token-exact repeat of the failed action, whose scored form is the block and end-of-turn)."""
        return program_written

    def same_action(self, text: str, failed_action: str) -> bool:
        """Programs compare as the extracted program in its canonical fenced form, on both sides: a seeded failed
        action is already in that form, the model's own is its answer as emitted."""
        return format_program(extract_program(text)) == format_program(extract_program(failed_action))

    def reference_actions(self) -> list[str]:
        return [format_program(source.code) for source in self.sources().values()]

    def repeats_failure(self, item: Item, text: str) -> bool:
        """The same failing test outcome: the completion fails the item's tests with the very verdict and message
        the failed action gets (both runs go through evaluate, so they are judged alike)."""
        got, failed = self.evaluate(item.source_id, text), self.evaluate(item.source_id, item.failed_action)
        return not got.ok and not failed.ok and (got.kind, got.message) == (failed.kind, failed.message)
