"""The seeded "prose" failure: the ground-truth call written as a sentence instead of in the call format.

Every on-policy tools failure of the embedded SmolLM2-135M in the last measured study (20 of 20) was prose instead of
a call (`model:syntax_error`), a kind none of the call mutations (mutations.py) produces. A prose failure says the
right call in words, in one of a few templates ("I will call get_weather with city set to 'Paris'."), so the runtime
rejects it as unparsable text with its own SyntaxError.

Which seeded items fail with prose is drawn per item from `random.Random(f"{seed}:{source_id}:prose")`, a stream of
its own: the call mutations of an item (its distractors, and its failed call when it does not draw prose) come from
`mutation_rng` exactly as before prose existed, so only the drawn items' failed actions change.
"""

from __future__ import annotations

import random
from typing import Any

from fastscore.study.data.envs.tools.mutations import MUTATION_KINDS, Mutation
from fastscore.study.data.envs.tools.runtime import Call, ToolRuntime

PROSE_KIND = "prose"
SEEDED_KINDS = (*MUTATION_KINDS, PROSE_KIND)
# Half the seeded items fail with prose: the kind the 135M model's own tools failures are, while the per-kind table
# keeps the call mutations (name typos, types, enums, ...) with as many items.
PROSE_SHARE = 0.5
SEEDED_MIX = (
    f"each item's failed action is prose instead of a call with probability {PROSE_SHARE:g} (drawn per item from "
    "its seeded rng), otherwise a call mutation of the first kind the ground truth admits among "
    + ", ".join(MUTATION_KINDS)
    + " in an order shuffled per item; the two other candidates are always call mutations"
)

# How a small model writes the call it was asked for as a sentence. Words of the runtime's description of an
# unparsable attempt ("Your previous attempt was not a well-formed ...", "The available tools are ...") are avoided:
# a failed action's own words may not reappear in its description (fastscore.study.data.hygiene).
_TEMPLATES = (
    "I will call {name} with {set_to}.",
    "To answer this, I would use {name} with {equals}.",
    "Sure! I can do that by calling {name} with {set_to}.",
    "You can use the {name} function: {colon}.",
    "Let me call {name} for you with {equals}.",
)
_NO_ARGUMENTS = "no arguments"


def prose_rng(seed: int, source_id: str) -> random.Random:
    return random.Random(f"{seed}:{source_id}:prose")


def _arguments(args: tuple[tuple[str, Any], ...], pattern: str, joiner: str) -> str:
    if not args:
        return _NO_ARGUMENTS
    return joiner.join(pattern.format(k=k, v=v) for k, v in args)


def prose_text(truth: Call, rng: random.Random) -> str:
    """The ground-truth call in words, in a template drawn by `rng` (values written as Python literals)."""
    template = rng.choice(_TEMPLATES)
    return template.format(
        name=truth.name,
        set_to=_arguments(truth.args, "{k} set to {v!r}", " and "),
        equals=_arguments(truth.args, "{k}={v!r}", ", "),
        colon=_arguments(truth.args, "{k}: {v!r}", ", "),
    )


def seeded_prose(truth: Call, runtime: ToolRuntime, seed: int, source_id: str,
                 share: float = PROSE_SHARE) -> Mutation | None:
    """The item's prose failure when its draw says prose (probability `share`), else None.

    Returned only when the runtime really rejects the text; its outcome is the runtime's own (a SyntaxError).
    """
    rng = prose_rng(seed, source_id)
    if rng.random() >= share:
        return None
    text = prose_text(truth, rng)
    outcome = runtime.execute(text)
    if outcome.ok:  # a sentence never parses as a call; if one ever did, it would be no failure
        return None
    return Mutation(PROSE_KIND, None, text, outcome)
