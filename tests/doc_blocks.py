"""Reading documentation: its fenced code blocks, its inline commands, and the shell commands inside them.

Used by tests/test_docs.py, which runs or checks every block of README.md, docs/*.md and the folders' READMEs.
A block preceded (on the nearest non-blank line) by `<!-- no-run: REASON -->` is not executed; the test counts it
and prints the reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

# A backtick fence's info string holds no backtick (CommonMark), so "```` ```sh ```` blocks" is prose, not a fence.
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}(?=[^`]*$)|~{3,})(?P<info>[^`\s]*)")
NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*(?P<reason>.+?)\s*-->\s*$")
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    no_run: str | None  # the reason given in a no-run marker, else None

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced code block of a markdown file, its indentation (list items) removed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, k = [], 0
    while k < len(lines):
        match = FENCE.match(lines[k])
        if not match:
            k += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        body, end = [], k + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            body.append(lines[end][indent:] if lines[end][:indent].strip() == "" else lines[end])
            end += 1
        previous = next((lines[j] for j in range(k - 1, -1, -1) if lines[j].strip()), "")
        marker = NO_RUN.match(previous)
        found.append(Block(path, k + 1, match["info"].lower(), "\n".join(body) + "\n",
                           marker["reason"] if marker else None))
        k = end + 1
    return found


def prose(path: Path) -> str:
    """The file's text outside fenced blocks (for inline commands)."""
    out, inside, fence = [], False, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        match = FENCE.match(line)
        if not inside and match:
            inside, fence = True, match["fence"]
        elif inside and line.strip().startswith(fence):
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def inline_commands(path: Path) -> list[str]:
    """Inline code spans that are whole commands: `fastscore ...` or `python -m fastscore....` (wrapped lines
    joined)."""
    spans = (" ".join(span.split()) for span in INLINE.findall(prose(path)))
    return [s for s in spans if s.startswith("fastscore ") or s.startswith("python -m fastscore.")
            or s.startswith("make ")]


def shell_lines(text: str) -> list[str]:
    """Logical lines of a shell block: backslash continuations joined, blank lines dropped."""
    joined, current = [], ""
    for raw in text.splitlines():
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        current += raw
        if current.strip():
            joined.append(current.strip())
        current = ""
    if current.strip():
        joined.append(current.strip())
    return joined


def commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line (comments dropped; split at ; && || | &), each as words."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out, current = [], []
    for word in lexer:
        if word in SEPARATORS:
            if current:
                out.append(current)
            current = []
        else:
            current.append(word)
    if current:
        out.append(current)
    return out
