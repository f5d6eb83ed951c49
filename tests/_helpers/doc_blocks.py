"""The code blocks of the documentation, as the docs tests run them: README.md and every page
under docs/ (found, not listed: a new page's blocks run without a change here).

A block is a fenced ```python or ```bash block, at the start of a line or indented inside a
list item (its indentation is removed). The line ``<!-- not run: <reason> -->`` just before a
block keeps it from being run; the reason is required.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(
    r"^(?:(?P<mark>[ \t]*<!--\s*not run:(?P<why>.*?)-->[ \t]*)\n)?"
    r"(?P<indent>[ \t]*)```(?P<lang>python|bash)[ \t]*\n(?P<code>.*?)^(?P=indent)```",
    re.M | re.S,
)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository's root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason, or None: the block runs

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md, then every Markdown page under docs/, in path order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(lang: str, page: Path | None = None) -> list[Block]:
    """Every ``lang`` block of ``page`` (of every page when None), in order."""
    found = []
    for path in [page] if page else pages():
        text = path.read_text()
        for match in _BLOCK.finditer(text):
            if match["lang"] != lang:
                continue
            why = match["why"].strip() if match["mark"] is not None else None
            line = text.count("\n", 0, match.start("indent")) + 1
            code = textwrap.dedent(match["code"])
            found.append(Block(str(path.relative_to(ROOT)), line, lang, code, why))
    return found
