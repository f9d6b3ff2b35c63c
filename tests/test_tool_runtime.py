"""The simulated tool runtime, its mutations, ground-truth matching and failure descriptions (crafted schemas)."""

from __future__ import annotations

import json
import random

import pytest

from fastscore.study.data.envs.tools.answers import canonical_call, match_answer
from fastscore.study.data.envs.tools.describe import describe_failure
from fastscore.study.data.envs.tools.mutations import MUTATION_KINDS, misspell, mutate, seeded_mutations
from fastscore.study.data.envs.tools.runtime import Call, ToolRejection, ToolRuntime, parse_call

AREA = {
    "name": "calculate_area",
    "description": "Area of a rectangle.",
    "parameters": {
        "type": "dict",
        "properties": {
            "width": {"type": "integer", "description": "The width."},
            "height": {"type": "integer", "description": "The height."},
            "unit": {"type": "string", "enum": ["cm", "m"], "description": "The unit."},
            "scale": {"type": "float", "description": "A scale factor."},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "blue"]}},
            "box": {"type": "dict", "properties": {"depth": {"type": "integer"}}, "required": ["depth"]},
            "exact": {"type": "boolean"},
            "point": {"type": "tuple", "items": {"type": "float"}},
            "data": {"type": "any"},
        },
        "required": ["width", "height"],
    },
}
DISTANCE = {
    "name": "geo.distance",
    "description": "Distance between two cities.",
    "parameters": {"type": "dict", "properties": {"a": {"type": "string"}, "b": {"type": "string"},
                                                  "c": {"type": "string"}}, "required": ["a", "b", "c"]},
}
RUNTIME = ToolRuntime([AREA, DISTANCE])
TRUTH = Call("calculate_area", (("width", 3), ("height", 4), ("unit", "cm"), ("scale", 1.5), ("tags", ["red"])))

REJECTIONS = [
    ("calculate_area(width=3, height=4", "syntax_error", "SyntaxError: '(' was never closed"),
    ("The area is 12.", "syntax_error", "SyntaxError: invalid syntax"),
    ("width + height", "syntax_error", "SyntaxError: expected a single function call"),
    ("calculate_area(width=3, width=4, height=1)", "syntax_error", "SyntaxError: keyword argument repeated: width"),
    ("calculate_area(width=3, height=4, **extra)", "syntax_error", "not * or **"),
    ("calculate_area(width=3, height=4 + 1)", "syntax_error",
     "argument 'height' of calculate_area() is not a literal"),
    ("calculate_araa(width=3, height=4)", "unknown_function", "NameError: name 'calculate_araa' is not defined"),
    ("geo.distanse(a='x', b='y', c='z')", "unknown_function",
     "AttributeError: module 'geo' has no attribute 'distanse'"),
    ("gio.distance(a='x', b='y', c='z')", "unknown_function", "NameError: name 'gio' is not defined"),
    ("calculate_area(3, 4)", "positional_argument",
     "TypeError: calculate_area() takes 0 positional arguments but 2 were given"),
    ("calculate_area(width=3, hieght=4)", "unexpected_parameter",
     "TypeError: calculate_area() got an unexpected keyword argument 'hieght'"),
    ("calculate_area(width=3)", "missing_required",
     "TypeError: calculate_area() missing 1 required keyword-only argument: 'height'"),
    ("calculate_area()", "missing_required",
     "TypeError: calculate_area() missing 2 required keyword-only arguments: 'width' and 'height'"),
    ("geo.distance()", "missing_required",
     "TypeError: geo.distance() missing 3 required keyword-only arguments: 'a', 'b', and 'c'"),
    ("calculate_area(width='3', height=4)", "wrong_type",
     "TypeError: calculate_area() argument 'width' must be int, not str"),
    ("calculate_area(width=True, height=4)", "wrong_type",
     "TypeError: calculate_area() argument 'width' must be int, not bool"),
    ("calculate_area(width=3.0, height=4)", "wrong_type",
     "TypeError: calculate_area() argument 'width' must be int, not float"),
    ("calculate_area(width=None, height=4)", "wrong_type",
     "TypeError: calculate_area() argument 'width' must be int, not NoneType"),
    ("calculate_area(width=3, height=4, exact='yes')", "wrong_type",
     "TypeError: calculate_area() argument 'exact' must be bool, not str"),
    ("calculate_area(width=3, height=4, point=[1.0, 'x'])", "wrong_type",
     "TypeError: calculate_area() argument 'point[1]' must be float, not str"),
    ("calculate_area(width=3, height=4, box={'depth': '2'})", "wrong_type",
     "TypeError: calculate_area() argument 'box['depth']' must be int, not str"),
    ("calculate_area(width=3, height=4, box={})", "missing_required",
     "TypeError: calculate_area() argument 'box' is missing required key(s): 'depth'"),
    ("calculate_area(width=3, height=4, box={'depth': 1, 'size': 2})", "unexpected_parameter",
     "TypeError: calculate_area() argument 'box' got an unexpected key 'size'"),
    ("calculate_area(width=3, height=4, unit='km')", "enum_violation",
     "ValueError: calculate_area() argument 'unit' must be one of ['cm', 'm'], got 'km'"),
    ("calculate_area(width=3, height=4, tags=['red', 'Blue'])", "enum_violation",
     "ValueError: calculate_area() argument 'tags[1]' must be one of ['red', 'blue'], got 'Blue'"),
    ("calculate_area(width=w, height=4)", "name_error", "NameError: name 'w' is not defined"),
]


@pytest.mark.parametrize("text,kind,message", REJECTIONS)
def test_runtime_rejects_with_python_like_message(text, kind, message):
    outcome = RUNTIME.execute(text)
    assert not outcome.ok
    assert outcome.kind == kind
    assert message in outcome.error, outcome.error


@pytest.mark.parametrize("text", [
    "calculate_area(width=3, height=4)",
    "  calculate_area(width=3, height=4, unit='m', scale=2, tags=['blue', 'red'])\n",  # an int is a valid float
    "calculate_area(width=3, height=4, box={'depth': 1}, exact=False, point=(1.0, 2.5), data={'x': [1]})",
    "calculate_area(width=3, height=4, unit=None)",  # optional None takes the default
    "geo.distance(a='Rome', b='Paris', c='Oslo')",
])
def test_runtime_accepts_valid_calls(text):
    outcome = RUNTIME.execute(text)
    assert outcome.ok and outcome.kind == "ok" and outcome.error == ""
    assert json.loads(outcome.result)["status"] == "success"


def test_parser_never_evaluates_the_call():
    outcome = RUNTIME.execute("calculate_area(width=__import__('os').system('exit 1'), height=4)")
    assert outcome.kind == "syntax_error"
    with pytest.raises(ToolRejection):
        parse_call("calculate_area(width=[x for x in range(3)], height=1)")


def test_render_is_the_canonical_format_and_round_trips():
    text = TRUTH.render()
    assert text == "calculate_area(width=3, height=4, unit='cm', scale=1.5, tags=['red'])"
    assert parse_call(text) == TRUTH
    assert RUNTIME.execute(text).ok


def test_misspell_is_a_fresh_identifier():
    rng = random.Random(0)
    for word in ("height", "calculate_area", "x"):
        typo = misspell(word, rng, {"width"})
        assert typo is not None and typo != word and typo.isidentifier() and typo != "width"


EXPECTED_RUNTIME_KIND = {
    "unknown_function": "unknown_function", "misspelled_parameter": "unexpected_parameter",
    "extra_parameter": "unexpected_parameter", "missing_required": "missing_required",
    "wrong_type": "wrong_type", "enum_violation": "enum_violation",
}


@pytest.mark.parametrize("kind", MUTATION_KINDS)
def test_each_mutation_kind_is_rejected_for_its_reason(kind):
    for seed in range(5):
        mutated = mutate(kind, TRUTH, AREA, set(RUNTIME.functions), random.Random(seed))
        assert mutated is not None and mutated != TRUTH
        outcome = RUNTIME.execute(mutated.render())
        assert not outcome.ok and outcome.kind == EXPECTED_RUNTIME_KIND[kind], (mutated.render(), outcome)


def test_mutations_without_a_target_are_not_offered():
    bare = Call("calculate_area", (("width", 3), ("height", 4)))
    assert mutate("enum_violation", bare, AREA, set(RUNTIME.functions), random.Random(0)) is None
    optional_only = Call("calculate_area", (("unit", "cm"),))
    assert mutate("missing_required", optional_only, AREA, set(RUNTIME.functions), random.Random(0)) is None


def test_seeded_mutations_are_reproducible_distinct_and_of_different_kinds():
    first = seeded_mutations(TRUTH, RUNTIME, random.Random("7:x"), 3)
    again = seeded_mutations(TRUTH, RUNTIME, random.Random("7:x"), 3)
    assert [m.text for m in first] == [m.text for m in again]
    assert len({m.text for m in first}) == 3 and TRUTH.render() not in {m.text for m in first}
    assert len({m.kind for m in first}) == 3
    assert all(not RUNTIME.execute(m.text).ok for m in first)
    texts = {tuple(m.text for m in seeded_mutations(TRUTH, RUNTIME, random.Random(f"{s}:x"), 3)) for s in range(10)}
    assert len(texts) > 1


def test_description_states_the_failure_without_quoting_the_call():
    text = "calculate_area(width=3, unit='cm')"
    outcome = RUNTIME.execute(text)
    target = len(text) + len(outcome.error)
    description = describe_failure(outcome, parse_call(text), RUNTIME.functions, target)
    assert text not in description
    assert "`calculate_area`" in description and "`height` (int)" in description
    assert 0.7 * target <= len(description) <= 1.6 * target, (len(description), target)


def test_canonical_call_takes_first_values_and_omits_optional_blanks():
    answer = {"width": [3, 5], "height": [4], "unit": ["", "cm"], "point": [[1.0, 2.0]],
              "box": [{"depth": [2]}], "scale": ["", 1.0]}
    call = canonical_call(AREA, answer)
    assert call.render() == "calculate_area(width=3, height=4, box={'depth': 2}, point=(1.0, 2.0))"  # schema order
    required_blank = canonical_call(AREA, {"width": ["", 7], "height": [4]})
    assert required_blank.kwargs["width"] == 7  # a required parameter cannot be omitted


def test_match_answer_follows_bfcl_semantics():
    answer = {"width": [3], "height": [4], "unit": ["", "cm"]}
    accept = ["calculate_area(width=3, height=4)", "calculate_area(width=3.0, height=4, unit='CM')",
              "calculate_area(width=3, height=4, unit=None)"]
    for text in accept:
        assert match_answer(parse_call(text), "calculate_area", answer).ok, text
    wrong = {
        "calculate_area(width=3, height=5)": "argument 'height' has an unexpected value 5",
        "calculate_area(width=3, height=4, exact=True)": "argument 'exact' should not be set",
        "calculate_area(width=3)": "argument 'height' is needed",
        "geo.distance(a='x', b='y', c='z')": "geo.distance() is not applicable",
    }
    for text, message in wrong.items():
        outcome = match_answer(parse_call(text), "calculate_area", answer)
        assert outcome.kind == "wrong_answer" and message in outcome.error, (text, outcome.error)
