"""Seeded mutations of a ground-truth call into calls the runtime rejects (the study's failed calls and distractors).

Kinds: unknown_function (misspelled function name), misspelled_parameter, extra_parameter, missing_required,
wrong_type (a number written as a string, a list as one string, ...), enum_violation (a near miss of an allowed
value). Mutations touch top-level arguments only. Every random choice comes from
`random.Random(f"{seed}:{source_id}")`, so an item's mutations do not depend on which other items are built or in
which order; every returned mutation has been run through the runtime and was rejected.
"""

from __future__ import annotations

import keyword
import logging
import random
from dataclasses import dataclass
from typing import Any

from fastscore.study.data.envs.tools.runtime import Call, ToolOutcome, ToolRuntime

log = logging.getLogger(__name__)

MUTATION_KINDS = (
    "unknown_function", "misspelled_parameter", "extra_parameter", "missing_required", "wrong_type", "enum_violation",
)

# Plausible arguments a model adds that the tool does not take; the first one absent from the schema is candidate.
_EXTRA_ARGUMENTS = (
    ("verbose", True), ("timeout", 30), ("format", "json"), ("limit", 10), ("language", "en"),
    ("precision", 2), ("debug", False), ("mode", "default"),
)
_VOWELS = "aeiou"
_MAX_TRIES = 30


@dataclass(frozen=True)
class Mutation:
    """A rejected variant of the ground truth: its kind, the call, its action text and the runtime's outcome."""

    kind: str
    call: Call | None  # None when the text is no call at all (a prose failure, prose.py)
    text: str
    outcome: ToolOutcome


def mutation_rng(seed: int, source_id: str) -> random.Random:
    return random.Random(f"{seed}:{source_id}")


def misspell(word: str, rng: random.Random, forbidden: set[str]) -> str | None:
    """A one-edit typo of `word` (drop, swap, double or change a vowel) that is a valid, unused identifier."""
    letters = [i for i, ch in enumerate(word) if ch.isalpha()]
    if not letters:
        return None
    for _ in range(_MAX_TRIES):
        op = rng.choice(("drop", "swap", "double", "vowel"))
        i = rng.choice(letters)
        if op == "drop" and i > 0:
            typo = word[:i] + word[i + 1:]
        elif op == "swap" and i + 1 < len(word) and word[i + 1].isalpha() and word[i] != word[i + 1]:
            typo = word[:i] + word[i + 1] + word[i] + word[i + 2:]
        elif op == "double":
            typo = word[:i] + word[i] + word[i:]
        elif op == "vowel" and word[i].lower() in _VOWELS:
            typo = word[:i] + rng.choice([v for v in _VOWELS if v != word[i].lower()]) + word[i + 1:]
        else:
            continue
        if typo != word and typo.isidentifier() and not keyword.iskeyword(typo) and typo not in forbidden:
            return typo
    return None


def _properties(function: dict) -> dict[str, dict]:
    return function.get("parameters", {}).get("properties", {})


def _replace(call: Call, key: str, value: Any) -> Call:
    return Call(call.name, tuple((k, value if k == key else v) for k, v in call.args))


def _wrong_typed(value: Any, schema: dict) -> Any:
    """The value as a model writes it with the wrong type, or None when there is no natural mistake."""
    kind = schema.get("type")
    if kind in ("integer", "float", "boolean") and isinstance(value, (int, float)):
        return str(value)
    if kind in ("array", "tuple") and value and all(isinstance(v, (str, int, float)) for v in value):
        return ", ".join(str(v) for v in value)
    if kind == "string" and isinstance(value, str):
        for parse in (int, float):
            try:
                return parse(value)
            except ValueError:
                continue
    return None


def _enum_near_miss(value: str, enum: list, rng: random.Random) -> str | None:
    variants = [value.lower(), value.upper(), value.title(), value.replace("_", " "), value.replace(" ", "_"),
                value + "s", value[:-1]]
    rng.shuffle(variants)
    for variant in variants:
        if variant and variant != value and variant not in enum:
            return variant
    return None


def _enum_targets(call: Call, properties: dict[str, dict]) -> list[str]:
    targets = []
    for key, value in call.args:
        schema = properties.get(key, {})
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        if isinstance(value, str) and schema.get("enum"):
            targets.append(key)
        elif isinstance(value, list) and value and items.get("enum") and all(isinstance(v, str) for v in value):
            targets.append(key)
    return targets


def mutate(kind: str, call: Call, function: dict, function_names: set[str], rng: random.Random) -> Call | None:
    """One mutation of `call` of the given kind, or None when this call offers no such mistake."""
    properties = _properties(function)
    keys = [k for k, _ in call.args]
    if kind == "unknown_function":
        head, dot, last = call.name.rpartition(".")
        forbidden = {n.rpartition(".")[2] for n in function_names if n.rpartition(".")[0] == head}
        typo = misspell(last, rng, forbidden)
        return None if typo is None else Call(f"{head}{dot}{typo}", call.args)
    if kind == "misspelled_parameter" and keys:
        key = rng.choice(keys)
        typo = misspell(key, rng, set(properties))
        if typo is None:
            return None
        return Call(call.name, tuple((typo if k == key else k, v) for k, v in call.args))
    if kind == "extra_parameter":
        options = [(k, v) for k, v in _EXTRA_ARGUMENTS if k not in properties]
        return Call(call.name, call.args + (rng.choice(options),)) if options else None
    if kind == "missing_required":
        required = [k for k in function.get("parameters", {}).get("required", []) if k in keys]
        if not required:
            return None
        key = rng.choice(required)
        return Call(call.name, tuple((k, v) for k, v in call.args if k != key))
    if kind == "wrong_type":
        options = [(k, _wrong_typed(v, properties.get(k, {}))) for k, v in call.args]
        options = [(k, w) for k, w in options if w is not None]
        if not options:
            return None
        key, wrong = rng.choice(options)
        return _replace(call, key, wrong)
    if kind == "enum_violation":
        targets = _enum_targets(call, properties)
        if not targets:
            return None
        key = rng.choice(targets)
        value = call.kwargs[key]
        if isinstance(value, str):
            miss = _enum_near_miss(value, properties[key]["enum"], rng)
            return None if miss is None else _replace(call, key, miss)
        index = rng.randrange(len(value))
        miss = _enum_near_miss(value[index], properties[key]["items"]["enum"], rng)
        return None if miss is None else _replace(call, key, value[:index] + [miss] + value[index + 1:])
    return None


def _rejected(kind: str, call: Call | None, runtime: ToolRuntime) -> Mutation | None:
    if call is None:
        return None
    text = call.render()
    outcome = runtime.execute(text)
    if outcome.ok:
        log.debug("mutation %s of %s was accepted by the runtime; discarded", kind, call.name)
        return None
    return Mutation(kind, call, text, outcome)


def seeded_mutations(
    truth: Call, runtime: ToolRuntime, rng: random.Random, count: int, exclude: tuple[str, ...] = ()
) -> list[Mutation]:
    """Up to `count` rejected mutations with distinct texts (none in `exclude`), of different kinds when possible.

    The first kind is drawn by `rng` among the kinds this call admits; later ones prefer kinds not used yet and fall
    back to further mutations of used kinds (different targets) when too few kinds apply.
    """
    function = runtime.schema(truth.name)
    names = set(runtime.functions)
    taken = set(exclude) | {truth.render()}
    found: list[Mutation] = []
    kinds = list(MUTATION_KINDS)
    rng.shuffle(kinds)
    for kind in kinds:  # one per kind, in the seeded order
        if len(found) == count:
            return found
        mutation = _rejected(kind, mutate(kind, truth, function, names, rng), runtime)
        if mutation is not None and mutation.text not in taken:
            found.append(mutation)
            taken.add(mutation.text)
    for _ in range(_MAX_TRIES):  # too few kinds apply: more of the same kinds, different targets
        if len(found) == count:
            break
        kind = rng.choice(kinds)
        mutation = _rejected(kind, mutate(kind, truth, function, names, rng), runtime)
        if mutation is not None and mutation.text not in taken:
            found.append(mutation)
            taken.add(mutation.text)
    return found
