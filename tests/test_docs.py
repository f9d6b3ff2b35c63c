"""The documentation agrees with the code: every code block of README.md, docs/*.md and the README.md of examples/,
bench/ and models/ is run or checked.

- ```python blocks are executed, each in its own namespace and a temporary working folder (blocks that open the
  embedded model use the session's cached conversion). A block preceded by `<!-- no-run: REASON -->` is skipped
  with that reason; `test_no_run_blocks_are_listed` prints how many and why.
- ```sh / ```bash blocks, and inline spans that are whole commands (`fastscore ...`, `python -m fastscore....`,
  `make ...`): every `fastscore` command line is parsed by the real click CLI (the subcommand must exist, every
  option must exist, and choice / integer values must be valid); `python -m` modules must exist (and their options
  too, where the module has a CLI); `make` targets must be in the Makefile; pip extras must be in pyproject.toml.
- ```json blocks must parse.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
from doc_blocks import Block, blocks, commands, inline_commands, shell_lines

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md",
        ROOT / "bench" / "README.md", ROOT / "models" / "README.md"]
DOCS = [path for path in DOCS if path.is_file()]
ALL_BLOCKS = [block for path in DOCS for block in blocks(path)]
SHELL_LANGS = {"sh", "bash", "shell", "console"}
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.lang in SHELL_LANGS]
JSON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "json"]
NEEDS_MODEL = re.compile(r"fastscore\.load\(")


class DocCommandError(AssertionError):
    """A documented command the code would refuse."""


# --- fastscore commands, parsed by the real CLI ------------------------------------------------------------------

def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    settings = dict(command.context_settings or {})
    return click.Context(command, info_name=name, parent=parent, **settings)  # only its parser runs: no callbacks


def _parse(command: click.Command, ctx: click.Context, args: list[str], groups: bool) -> tuple[dict, list[str]]:
    parser = command.make_parser(ctx)
    if groups:
        parser.allow_interspersed_args = False
    try:
        values, rest, _order = parser.parse_args(list(args))
    except click.BadOptionUsage as exc:
        if args and exc.option_name == args[-1] and "requires an argument" in exc.message:
            return _parse(command, ctx, [*args, "VALUE"], groups)  # prose naming an option: `fastscore sweep --ray`
        raise DocCommandError(f"{ctx.command_path}: {exc.format_message()}") from None
    except click.UsageError as exc:  # NoSuchOption, an option without its value mid-command, ...
        raise DocCommandError(f"{ctx.command_path}: {exc.format_message()}") from None
    return values, rest


def _check_values(command: click.Command, ctx: click.Context, values: dict) -> None:
    """Choice and integer values must convert (paths are left alone: the documented files need not exist here)."""
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or param.name not in values or param.is_flag:
            continue
        if not isinstance(param.type, (click.Choice, click.types.IntParamType, click.types.FloatParamType)):
            continue
        given = values[param.name]
        for value in given if isinstance(given, (list, tuple)) else [given]:
            try:
                param.type.convert(value, param, ctx)
            except click.BadParameter as exc:
                raise DocCommandError(f"{ctx.command_path} {param.opts[-1]}: {exc.format_message()}") from None


def check_fastscore(words: list[str]) -> None:
    """Parse `fastscore ARGS...` with the real click group: subcommands, options and their values must exist."""
    from fastscore.cli import main

    command: click.Command = main
    ctx = _context(main, "fastscore", None)
    args = words[1:]
    while isinstance(command, click.Group):
        values, rest = _parse(command, ctx, args, groups=True)
        _check_values(command, ctx, values)
        if not rest:
            return  # `fastscore --version`, `fastscore models -h`
        name, args = rest[0], rest[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            raise DocCommandError(f"{ctx.command_path}: no such command {name!r}")
        command, ctx = sub, _context(sub, name, ctx)
    values, rest = _parse(command, ctx, args, groups=False)
    _check_values(command, ctx, values)
    if rest:
        raise DocCommandError(f"{ctx.command_path}: unexpected extra arguments {rest}")


# --- python -m, make, pip ---------------------------------------------------------------------------------------

@functools.cache
def _module_options(module: str) -> frozenset[str] | None:
    """The options a `python -m MODULE` CLI offers, from its --help (None: the module has no option parser)."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations is not None:  # a package runs its __main__
        spec = importlib.util.find_spec(f"{module}.__main__")
    if spec is None:
        raise DocCommandError(f"python -m {module}: no such module")
    source = Path(spec.origin).read_text(encoding="utf-8") if spec.origin and spec.origin.endswith(".py") else ""
    if "click.command" not in source and "ArgumentParser" not in source:
        return None
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, f"python -m {module} --help failed: {done.stderr[-500:]}"
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", done.stdout))


def check_module(module: str, args: list[str]) -> None:
    offered = _module_options(module)
    if offered is None:
        return
    for arg in args:
        option = arg.split("=", 1)[0]
        if option.startswith("-") and option not in offered:
            raise DocCommandError(f"python -m {module}: no such option {option}")


@functools.cache
def _make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.M))


@functools.cache
def _extras() -> frozenset[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return frozenset(project["optional-dependencies"])


# Words that may stand before the command itself (`CI=true nice -n 10 .venv/bin/fastscore ...`); a `fastscore`
# further on is an argument of another program (`lm_eval --model fastscore`), not a command of ours.
_LAUNCHERS = re.compile(r"^(\w+=\S*|sudo|time|nice|env|exec|timeout|-n|\d+|(\S*/)?python3?(\.\d+)?)$")


def check_words(words: list[str]) -> str | None:
    """Check one simple command; returns what kind it was (None: not ours to check)."""
    for k, word in enumerate(words):
        if k and not _LAUNCHERS.match(words[k - 1]):
            break
        if word == "fastscore" or word.endswith("/fastscore"):
            check_fastscore(words[k:])
            return "fastscore"
        if word == "-m" and k + 1 < len(words) and words[k + 1].startswith("fastscore"):
            check_module(words[k + 1], words[k + 2:])
            return "python -m"
    if words and words[0] == "make":
        for target in words[1:]:
            if "=" not in target and not target.startswith("-") and target not in _make_targets():
                raise DocCommandError(f"make {target}: no such Makefile target")
        return "make"
    if words and words[0] in ("pip", "pip3") or words[:3] == ["python", "-m", "pip"]:
        for word in words:
            for extras in re.findall(r"(?:^\.|fastscore-cpu)\[([^\]]+)\]", word):
                unknown = [e for e in extras.split(",") if e.strip() not in _extras()]
                if unknown:
                    raise DocCommandError(f"{word}: no such pip extra {unknown} (pyproject.toml)")
        return "pip"
    return None


def check_shell(text: str) -> list[str]:
    kinds = []
    for line in shell_lines(text):
        for words in commands(line):
            kind = check_words(words)
            if kind:
                kinds.append(kind)
    return kinds


# --- the tests ---------------------------------------------------------------------------------------------------

def _ids(items: list[Block]) -> list[str]:
    return [block.where for block in items]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=_ids(PYTHON_BLOCKS))
def test_python_block_runs(block: Block, tmp_path, monkeypatch, request) -> None:
    if block.no_run:
        pytest.skip(f"no-run: {block.no_run}")
    if NEEDS_MODEL.search(block.text):
        request.getfixturevalue("smollm_artefact")("llamacpp", "f32")  # the default's conversion, cached once
    monkeypatch.chdir(tmp_path)
    exec(compile(block.text, block.where, "exec"), {"__name__": "__doc_block__"})  # noqa: S102


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=_ids(SHELL_BLOCKS))
def test_shell_block_commands_exist(block: Block) -> None:
    kinds = check_shell(block.text)
    print(f"{block.where}: checked {len(kinds)} commands ({', '.join(sorted(set(kinds))) or 'none of ours'})")


@pytest.mark.parametrize("path", DOCS, ids=[p.relative_to(ROOT).as_posix() for p in DOCS])
def test_inline_commands_exist(path: Path) -> None:
    spans = inline_commands(path)
    for span in spans:
        check_shell(span)
    print(f"{path.relative_to(ROOT)}: {len(spans)} inline commands checked")


@pytest.mark.parametrize("block", JSON_BLOCKS, ids=_ids(JSON_BLOCKS))
def test_json_block_parses(block: Block) -> None:
    json.loads(block.text)


def test_no_run_blocks_are_listed() -> None:
    skipped = [b for b in ALL_BLOCKS if b.no_run]
    print(f"{len(ALL_BLOCKS)} code blocks in {len(DOCS)} files; {len(skipped)} not run:")
    for block in skipped:
        print(f"  {block.where} ({block.lang}): {block.no_run}")
    assert all(b.no_run.strip() for b in skipped), "a no-run marker must give its reason"
    assert not [b for b in skipped if b.lang in SHELL_LANGS | {"json"}], "shell and json blocks are always checked"


def test_the_checker_refuses_what_the_cli_refuses() -> None:
    """The checks can fail: an option, a subcommand, a choice or a target that does not exist is refused."""
    check_shell("fastscore score requests.jsonl --out s.jsonl --top-k 5 --format parquet  # fine\n")
    check_shell("fastscore models list && fastscore --version; make test-all")
    check_shell("fastscore sweep --ray")  # prose naming an option that takes a value
    check_shell("fastscore-lm-eval --model fastscore --model_args backend=llamacpp --tasks t")  # not our command
    check_shell("CI=true nice -n 10 .venv/bin/python -m fastscore.study.data.caps --help")
    refused = {
        "fastscore score requests.jsonl --out s.jsonl --no-such-option 3": "No such option '--no-such-option'",
        "fastscore score requests.jsonl --out s.jsonl --resume --on-error skip --thread 2": "No such option '--thread'",
        "fastscore scorre requests.jsonl": "no such command 'scorre'",
        "fastscore score requests.jsonl --out s.jsonl --format xml": "--format",
        "fastscore study --limit 20 --threads zero": "--threads",
        "fastscore score a.jsonl b.jsonl --out s.jsonl": "unexpected extra arguments",
        "fastscore score a.jsonl --top-k --out s.jsonl": "--top-k",
        "fastscore models lisst": "no such command 'lisst'",
        "python -m fastscore.bench.lab.decode_bound --streams 32 --stream 8": "no such option --stream",
        "python -m fastscore.no_such_module --help": "no such module",
        "make tests": "no such Makefile target",
        "pip install -e '.[llamacp]'": "no such pip extra",
    }
    for line, reason in refused.items():
        with pytest.raises(DocCommandError, match=re.escape(reason)):
            check_shell(line)


def test_the_reader_finds_blocks_markers_and_inline_commands(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `fastscore score a.jsonl --out\n  b.jsonl` or `fastscore.load()`; ```` ```sh ```` is prose.\n\n"
        "- a list item:\n\n  ```sh\n  fastscore models list \\\n    # a comment\n  ```\n\n"
        "<!-- no-run: hours of work -->\n\n```python\nimport time\n```\n\n```json\n{\"a\": 1}\n```\n",
        encoding="utf-8")
    found = blocks(page)
    assert [(b.lang, b.no_run) for b in found] == [("sh", None), ("python", "hours of work"), ("json", None)]
    assert shell_lines(found[0].text) == ["fastscore models list    # a comment"]
    assert commands(shell_lines(found[0].text)[0]) == [["fastscore", "models", "list"]]
    assert inline_commands(page) == ["fastscore score a.jsonl --out b.jsonl"]
