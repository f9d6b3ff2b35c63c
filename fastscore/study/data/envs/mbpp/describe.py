"""Runtime-generated description of a failed MBPP program (the "description" remedy of the study).

The description says what happened when the tests ran (which function, which test, what kind of symptom) without
repeating the program text and without hinting at the fix: it uses only the run's outcome, the program's outline
(function names and parameters, counts of loops and branches — the same for the reference and every mutant) and the
task's tests. The remedy is meant to cost no tokens, so further facts (the task's tests) are added until the
description is roughly as long as the failed program plus its error message.
"""

from __future__ import annotations

import ast
import warnings

from fastscore.study.data.envs.mbpp.sandbox import RunOutcome
from fastscore.study.data.hygiene import template_wording


_EXCEPTION_GLOSSES = {
    "TypeError": "an operation was applied to a value of the wrong type",
    "ValueError": "a value had the right type but an unsuitable content",
    "IndexError": "a sequence index was out of range",
    "KeyError": "a key was missing from a mapping",
    "NameError": "a name was used that is not defined",
    "UnboundLocalError": "a local variable was used before it was assigned",
    "AttributeError": "an attribute or method was looked up on an object that does not have it",
    "ZeroDivisionError": "a number was divided by zero",
    "RecursionError": "the recursion never reached its base case within the recursion limit",
    "AssertionError": "an assertion inside the program did not hold",
    "StopIteration": "an iterator was advanced past its end",
    "OverflowError": "a numeric result was too large to represent",
    "SyntaxError": "the program is not valid Python",
    "IndentationError": "the program's indentation is not valid Python",
}


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _an(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def _outline(program: str) -> tuple[str, str]:
    """Functions with their parameter names (no defaults, no bodies), and a count of control structures."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # old MBPP solutions use invalid string escapes like "\w"
            tree = ast.parse(program)
    except (SyntaxError, ValueError):
        return "Your previous program could not be parsed as Python.", ""
    defs = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
            defs.append(f"`{node.name}({', '.join(params)})`")
        elif isinstance(node, ast.ClassDef):
            defs.append(f"a class `{node.name}`")
    nodes = list(ast.walk(tree))
    loops = sum(isinstance(n, (ast.For, ast.While, ast.comprehension)) for n in nodes)
    branches = sum(isinstance(n, (ast.If, ast.IfExp)) for n in nodes)
    returns = sum(isinstance(n, ast.Return) for n in nodes)
    lines = len([line for line in program.split("\n") if line.strip()])
    head = f"Your previous program defined {', '.join(defs) if defs else 'no function'}."
    structure = (
        f"It has {_plural(lines, 'line')}, {_plural(loops, 'loop')}, {_plural(branches, 'conditional')} "
        f"and {_plural(returns, 'return statement')}."
    )
    return head, structure


def _symptom(outcome: RunOutcome) -> str:
    test = f"the test `{outcome.failing_test.strip()}`" if outcome.failing_test else ""
    exception = outcome.message.split(":", 1)[0].strip() if outcome.message else "an error"
    gloss = _EXCEPTION_GLOSSES.get(exception, "the program stopped with an exception")
    if outcome.status == "failed":
        return f"It ran, but {test} failed: the function returned a value different from the one the test expects."
    if outcome.status == "error" and exception in ("SyntaxError", "IndentationError"):
        return f"It could not be loaded ({exception}: {gloss}), so none of the tests ran."
    if outcome.status == "error" and test:
        return f"It raised {_an(exception)} while running {test}: {gloss}."
    if outcome.status == "error":
        return f"It raised {_an(exception)} while the program was being loaded, before any test ran: {gloss}."
    if outcome.status == "timeout":
        return "It did not finish the tests within the time limit, so the run was stopped."
    if outcome.status == "memory":
        return "It used more memory than the limit allows, so the run was stopped."
    if outcome.status == "crash":
        return "Its process crashed before the tests finished."
    return "The tests did not pass."


def describe_failure(program: str, outcome: RunOutcome, tests: tuple[str, ...], target_chars: int) -> str:
    """A description of the failed run of `program`, about `target_chars` long, that never quotes the program.

    The outline of the program and what happened are always stated; further facts are added, in order, while each
    brings the length closer to `target_chars`.
    """
    head, structure = _outline(program)
    parts = [head, _symptom(outcome)]
    test_facts = [f"The task's tests are: `{tests[0].strip()}`"] if tests else []
    test_facts += [f"`{t.strip()}`" for t in tests[1:]]
    # No closing instruction ("write a corrected program"): `before` has none, and one here would confound the
    # description with the dont_repeat instruction.
    optional = [("structure", structure)]
    optional += [("test", fact) for fact in test_facts]
    chosen: dict[str, list[str]] = {"structure": [], "test": []}

    def render() -> str:
        tests_sentence = ["; ".join(chosen["test"]) + "."] if chosen["test"] else []
        return " ".join([parts[0], *chosen["structure"], parts[1], *tests_sentence])

    for slot, fact in optional:
        if not fact:
            continue
        before = abs(len(render()) - target_chars)
        chosen[slot].append(fact)
        if abs(len(render()) - target_chars) >= before:
            chosen[slot].pop()
            if slot == "test":
                break  # the tests are listed as a prefix: stop at the first one that overshoots
    return render()


# Words this module writes whatever the model wrote: not quotes of a failed action (fastscore.study.data.hygiene).
WORDING = template_wording(__name__)
