"""The simulated tool-calling environment: study items built from BFCL (simple_python and multiple).

Each item shows the tools' JSON schemas and the call format in the system prompt and the BFCL question as the user
turn. Its failed action is a seeded mutation of the ground truth that the simulated runtime rejects (see
mutations.py), or for a seeded share of the items the ground truth written as prose instead of a call (prose.py);
the candidate set is: failed action, ground truth, then two other rejected call mutations. Actions use
the one format documented in runtime.py: `func_name(param=value, ...)` with Python literal values.

Data layout: `data_dir/bfcl/<set>.json` and `data_dir/bfcl/possible_answer/<set>.json`, JSON lines.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastscore.errors import DataError
from fastscore.jsonl import read_json_objects
from fastscore.study.data.hygiene import check_description, redact
from fastscore.study.data.envs.base import Outcome, Records, StudyEnv
from fastscore.study.data.items import Item, Skipped
from fastscore.study.data.envs.tools.answers import GroundTruthError, canonical_call, match_answer
from fastscore.study.data.envs.tools.describe import WORDING, describe_failure
from fastscore.study.data.envs.tools.native import NativeItem, native_item
from fastscore.study.data.envs.tools.mutations import mutation_rng, seeded_mutations
from fastscore.study.data.envs.tools.prose import SEEDED_MIX, seeded_prose
from fastscore.study.data.envs.tools.runtime import (
    CALL_FORMAT_INSTRUCTIONS, Call, ToolOutcome, ToolRejection, ToolRuntime, parse_call, same_call, same_call_possible,
)

log = logging.getLogger(__name__)

ENV = "tools"
DATASETS = ("BFCL_v4_simple_python", "BFCL_v4_multiple")
N_CANDIDATES = 4

# How the record after the failed call is shown, per condition (ToolsEnv.records).
RECORD_ROLE = "tool"
SUCCESS_TEMPLATE = 'OK: {function} returned {{"status": "success"}}'
NEUTRAL_MESSAGE = "Call received."
DONT_REPEAT_INSTRUCTION = "Do not repeat the failed call."

SYSTEM_PREAMBLE = (
    "You are a function-calling assistant. Answer the user's request by calling one of these tools, "
    "given as JSON schemas:"
)


@dataclass(frozen=True)
class ToolSource:
    """One BFCL record: the question, the tools it offers and its possible answers (raw BFCL ground_truth)."""

    source_id: str
    dataset: str
    question: str
    functions: tuple[dict, ...] = field(hash=False)
    ground_truth: tuple[dict, ...] = field(hash=False)


class _Unusable(Exception):
    """A record that yields no item; the message is the Skipped reason."""


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    records = read_json_objects(path)
    for number, record in records:
        if not isinstance(record.get("id"), str):
            raise DataError(f"{path}: line {number}: expected a JSON object with a string 'id'")
    return records


def _user_content(question: Any, where: str) -> str:
    if not isinstance(question, list) or not all(isinstance(turn, list) for turn in question):
        raise DataError(f"{where}: 'question' must be a list of turns (lists of messages)")
    parts = []
    for turn in question:
        for message in turn:
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise DataError(f"{where}: every message needs 'role' and 'content'")
            if message["role"] == "user":
                parts.append(str(message["content"]))
    return "\n\n".join(parts)


def _check_functions(functions: Any, where: str) -> tuple[dict, ...]:
    if not isinstance(functions, list) or not functions:
        raise DataError(f"{where}: 'function' must be a non-empty list of schemas")
    for schema in functions:
        if (not isinstance(schema, dict) or not isinstance(schema.get("name"), str)
                or not isinstance(schema.get("parameters"), dict)
                or not isinstance(schema["parameters"].get("properties", {}), dict)):
            raise DataError(f"{where}: every function needs a 'name' and a 'parameters' object")
    return tuple(functions)


def load_sources(data_dir: Path) -> list[ToolSource]:
    """Read the BFCL question and possible-answer files; raises DataError naming the file and line."""
    sources = []
    for dataset in DATASETS:
        question_path = Path(data_dir) / "bfcl" / f"{dataset}.json"
        answer_path = Path(data_dir) / "bfcl" / "possible_answer" / f"{dataset}.json"
        answers = {}
        for number, record in _read_jsonl(answer_path):
            if not isinstance(record.get("ground_truth"), list):
                raise DataError(f"{answer_path}: line {number}: 'ground_truth' must be a list")
            answers[record["id"]] = tuple(record["ground_truth"])
        seen = set()
        for number, record in _read_jsonl(question_path):
            where = f"{question_path}: line {number}"
            source_id = record["id"]
            if source_id in seen:
                raise DataError(f"{where}: duplicate id {source_id!r}")
            if source_id not in answers:
                raise DataError(f"{where}: id {source_id!r} has no possible answer in {answer_path}")
            seen.add(source_id)
            sources.append(ToolSource(
                source_id=source_id,
                dataset=dataset,
                question=_user_content(record.get("question"), where),
                functions=_check_functions(record.get("function"), where),
                ground_truth=answers[source_id],
            ))
    log.info("loaded %d BFCL records from %s", len(sources), data_dir)
    return sources


def _single_answer(source: ToolSource) -> tuple[str, dict]:
    if len(source.ground_truth) != 1:
        raise _Unusable(f"ground truth has {len(source.ground_truth)} calls, need exactly one")
    entry = source.ground_truth[0]
    if not isinstance(entry, dict) or len(entry) != 1:
        raise _Unusable("ground truth entry is not exactly one call")
    (name, answer), = entry.items()
    if not isinstance(answer, dict):
        raise _Unusable("ground truth arguments are not an object")
    return name, answer


def _truth(source: ToolSource, runtime: ToolRuntime) -> Call:
    """The canonical ground-truth call, checked against the runtime and the possible answers."""
    if not source.question.strip():
        raise _Unusable("question has no user content")
    name, answer = _single_answer(source)
    if name not in runtime.functions:
        raise _Unusable(f"ground-truth function {name!r} is not among the tools")
    try:
        truth = canonical_call(runtime.schema(name), answer)
    except GroundTruthError as exc:
        raise _Unusable(f"ground truth unusable: {exc}") from None
    outcome = runtime.execute(truth.render())
    if not outcome.ok:
        raise _Unusable(f"ground truth rejected by the runtime: {outcome.error}")
    if not match_answer(truth, name, answer).ok:
        raise _Unusable("ground truth does not match its own possible answers")
    return truth


def system_prompt(source: ToolSource) -> str:
    tools = "\n".join(json.dumps(f, ensure_ascii=False) for f in source.functions)
    return f"{SYSTEM_PREAMBLE}\n{tools}\n\n{CALL_FORMAT_INSTRUCTIONS}"


def _description(source: ToolSource, outcome: ToolOutcome, action: str, call: Call | None, runtime: ToolRuntime,
                 truth: Call) -> tuple[str, int]:
    """The description and how many quoted substrings of the failed call were replaced by a marker (the model's own
    calls and prose can share names and words with the runtime's text); ValueError if it would still quote the
    failed call or a name it made up (fastscore.study.data.hygiene)."""
    target = len(action) + len(outcome.error)
    context = system_prompt(source) + "\n" + source.question
    text, redacted = redact(describe_failure(outcome, call, runtime.functions, target), action, truth.render(), context,
                            WORDING)
    check_description(text, action, truth.render(), context, WORDING)
    return text, redacted


def _item(source: ToolSource, item_id: str, failed: str, outcome: ToolOutcome, kind: str, truth: Call,
          others: list, description: str, meta: dict) -> Item:
    candidates = (failed, truth.render(), *(m.text for m in others))
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"{item_id}: candidates are not distinct")
    if len(candidates) != N_CANDIDATES:
        raise ValueError(f"only {len(candidates)} distinct candidates (the set has a fixed size of {N_CANDIDATES})")
    return Item(
        env=ENV, item_id=item_id, source_id=source.source_id, system=system_prompt(source), task=source.question,
        failed_action=failed, error_message=outcome.error, failure_kind=kind, correct_actions=(truth.render(),),
        candidates=candidates, description=description,
        meta={"dataset": source.dataset, "function": truth.name, "runtime_kind": outcome.kind,
              "candidate_kinds": [kind, "ground_truth", *(m.kind for m in others)], **meta},
    )


def _seeded_item(source: ToolSource, seed: int) -> Item:
    runtime = ToolRuntime(source.functions)
    truth = _truth(source, runtime)
    mutations = seeded_mutations(truth, runtime, mutation_rng(seed, source.source_id), N_CANDIDATES - 1)
    if not mutations:
        raise _Unusable("no mutation of the ground truth is rejected by the runtime")
    failed, others = mutations[0], mutations[1:]
    # A prose item is the same item with its failed call replaced by the call in words: same distractors, and the
    # same sources are usable (both need three call mutations).
    failed = seeded_prose(truth, runtime, seed, source.source_id) or failed
    outcome = runtime.execute(failed.text)
    if outcome.ok or outcome != failed.outcome:
        raise AssertionError(f"{source.source_id}: failed call {failed.text!r} is not rejected by the runtime")
    try:
        description, redacted = _description(source, outcome, failed.text, failed.call, runtime, truth)
        return _item(source, f"{ENV}:{source.source_id}", failed.text, outcome, failed.kind, truth, others,
                     description, {"seed": seed, "failures": "seeded", "description_redacted": redacted})
    except ValueError as exc:
        raise _Unusable(str(exc)) from None


def usable_sources(sources: list[ToolSource], limit: int | None, seed: int
                   ) -> tuple[list[tuple[ToolSource, Item]], list[Skipped]]:
    """The first `limit` usable records in the seed's shuffled order, each with its seeded item; skips examined."""
    order = list(sources)
    random.Random(f"{seed}:order").shuffle(order)
    chosen: list[tuple[ToolSource, Item]] = []
    skipped: list[Skipped] = []
    for source in order:
        if limit is not None and len(chosen) >= limit:
            break
        try:
            chosen.append((source, _seeded_item(source, seed)))
        except _Unusable as exc:
            skipped.append(Skipped(ENV, source.source_id, str(exc)))
    log.info("tools: %d items, %d records skipped", len(chosen), len(skipped))
    return chosen, skipped


def build_items(data_dir: Path, limit: int | None, seed: int, sources: list[ToolSource] | None = None
                ) -> tuple[list[Item], list[Skipped]]:
    """Deterministic seeded items: same seed, same items. Skipped lists the unusable records met on the way."""
    chosen, skipped = usable_sources(load_sources(data_dir) if sources is None else sources, limit, seed)
    return [item for _, item in chosen], skipped


def evaluate(source: ToolSource, action: str) -> ToolOutcome:
    """Run a model's action: the runtime's rejection, "wrong_answer" if accepted but not a possible answer, or ok."""
    runtime = ToolRuntime(source.functions)
    outcome = runtime.execute(action)
    if not outcome.ok:
        return outcome
    try:
        name, answer = _single_answer(source)
    except _Unusable as exc:
        raise DataError(f"{source.source_id}: {exc}") from None
    judged = match_answer(parse_call(action), name, answer)
    return outcome if judged.ok else judged


def item_from_failure(source: ToolSource, action: str, outcome: ToolOutcome, seed: int) -> Item:
    """An item whose failed call is the model's own `action` (rejected, `outcome` from evaluate)."""
    if outcome.ok or evaluate(source, action).ok:
        raise ValueError(f"{source.source_id}: the action was accepted, it is not a failure")
    if outcome.kind == "wrong_answer":
        # A real runtime runs an accepted call and returns its result; any error text here would be an oracle's.
        raise ValueError("the runtime accepted the call (a wrong answer, but no runtime error to record)")
    runtime = ToolRuntime(source.functions)
    try:
        truth = _truth(source, runtime)
    except _Unusable as exc:
        raise DataError(f"{source.source_id}: {exc}") from None
    if action == truth.render():
        raise ValueError(f"{source.source_id}: the action is the ground truth")
    rng = mutation_rng(seed, source.source_id)
    others = seeded_mutations(truth, runtime, rng, N_CANDIDATES - 2, exclude=(action,))
    try:
        call = parse_call(action)
    except ToolRejection:
        call = None
    description, redacted = _description(source, outcome, action, call, runtime, truth)
    return _item(source, f"{ENV}:{source.source_id}:model", action, outcome, "model", truth, others,
                 description, {"seed": seed, "failures": "model", "description_redacted": redacted})


def _called_function(item: Item) -> str:
    try:
        return parse_call(item.failed_action).name
    except ToolRejection:
        return parse_call(item.correct_actions[0]).name


class ToolsEnv(StudyEnv):
    name = ENV
    # From the data (fastscore.study.data.caps, embedded tokenizer): the 600 reference calls' p99 is 63 tokens (max 87);
    # + 25% margin = 80 (cuts 0.2% of the references). tests/test_study_caps.py checks it.
    max_new_tokens = 80
    seeded_mix = SEEDED_MIX
    records = Records(role=RECORD_ROLE, failure_prefix="", neutral=NEUTRAL_MESSAGE,
                      dont_repeat=DONT_REPEAT_INSTRUCTION, dont_repeat_separator="\n")

    def load_sources(self) -> list[ToolSource]:
        return load_sources(self.data_dir)

    def source_id(self, source: ToolSource) -> str:
        return source.source_id

    def build_items(self, limit: int, seed: int) -> tuple[list[Item], list[Skipped]]:
        return build_items(self.data_dir, limit, seed, sources=list(self.sources().values()))

    def judge(self, source: ToolSource, text: str) -> Outcome:
        outcome = evaluate(source, text)
        return Outcome(ok=outcome.ok, message=outcome.error, kind=outcome.kind, native=outcome)

    def failure_item(self, source: ToolSource, text: str, outcome: Outcome, seed: int) -> Item:
        return item_from_failure(source, text, outcome.native, seed)

    def native_tools(self, item: Item) -> NativeItem:
        return native_item(self.source(item.source_id).functions, item.candidates)

    def reference_actions(self) -> list[str]:
        """The ground-truth call of every usable source, rendered as the study renders it."""
        out = []
        for source in self.sources().values():
            try:
                out.append(_truth(source, ToolRuntime(source.functions)).render())
            except _Unusable:
                continue
        return out

    def repeats_failure(self, item: Item, text: str) -> bool:
        """The same call after argument normalisation (see same_call)."""
        return same_call(text, item.failed_action)

    def may_repeat(self, item: Item) -> Callable[[str], bool]:
        """By the text's words and the called function's name (see same_call_possible)."""
        return same_call_possible(item.failed_action)

    def success_message(self, item: Item) -> str:
        return SUCCESS_TEMPLATE.format(function=_called_function(item))
