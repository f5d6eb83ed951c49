"""``phalanx migrate PATH... [--write | --check]``: port Ray Train code to phalanx."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.cli._runs import CLIError

if TYPE_CHECKING:
    from phalanx.migrate import Attention

__all__ = ["EXIT_ATTENTION", "EXIT_WOULD_CHANGE", "add_parser", "migrate"]

EXIT_WOULD_CHANGE = 1
EXIT_ATTENTION = 2

_DESCRIPTION = """\
Rewrite Ray Train code (V2 and AIR era) to phalanx with libcst, keeping comments and formatting:
every import form (import ray, import ray.train as train, from ray import train, the
ray.train.torch names, ray.train.v2.*, ray.air.*) and every use (ray.train.report,
ray.train.torch.TorchTrainer, ray.data.from_pandas, session.get_world_rank(), ...). Ray Core
(ray.remote, ray.get, ray.init(address=...)) stays, with `import ray`; a bare ray.init() and
ray.shutdown() are removed when nothing else uses Ray. What phalanx has no equivalent for
(Ray Tune, Ray Serve, some ray.data functions) is left as it is and listed at the end with
file:line and what to do. Directories are walked for *.py files. Running it twice changes
nothing the second time. Needs phalanx[migrate] (libcst).

Without --write: prints a unified diff of each file that would change (stdout); the notes and
the "needs your attention" list go to stderr.

exit status:
  0  nothing to change, or changed (--write) with nothing left to look at
  1  --check: some file would change
  2  something could not be migrated (listed under "needs your attention"), or a file
     could not be parsed; takes precedence over 1
"""

Out = Callable[[str], None]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "migrate",
        help="port Ray Train code to phalanx (a diff, or --write)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="a .py file or a directory")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the files in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when a file would change")


def migrate(args: argparse.Namespace, out: Out, err: Out) -> int:
    """Run ``phalanx migrate`` on ``args.paths``; returns the exit status."""
    from phalanx._foundation.optional import require

    cst = require("libcst", "phalanx migrate", extra="migrate")
    from phalanx.migrate import migrate_source

    changed, attention, failed = 0, 0, 0
    files = list(_python_files(args.paths))
    for path in files:
        try:
            old = _read(path)
            migrated = migrate_source(old)
        except (UnicodeDecodeError, cst.ParserSyntaxError) as exc:  # name it, go on with the rest
            err(f"{path}: could not migrate: {str(exc).splitlines()[0]}")
            failed += 1
            continue
        for note in migrated.notes:
            err(f"{path}:{note}")
        attention += _attention(path, migrated.attention, err, first=attention == 0)
        if migrated.code == old:
            continue
        changed += 1
        if args.write:
            _write(path, migrated.code)
            err(f"migrated {path}")
        else:
            out("".join(_diff(path, old, migrated.code)).rstrip("\n"))
    verb = "migrated" if args.write else "would change"
    err(f"{len(files)} file(s): {changed} {verb}, {attention} item(s) need your attention")
    if attention or failed:
        return EXIT_ATTENTION
    return EXIT_WOULD_CHANGE if args.check and changed else 0


def _attention(path: Path, items: tuple[Attention, ...], err: Out, first: bool) -> int:
    if items and first:
        err("needs your attention (left as it was):")
    for item in items:
        err(f"{path}:{item.line}: {item.name} -> {item.advice}")
    return len(items)


def _diff(path: Path, old: str, new: str) -> Iterator[str]:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        str(path) if path.is_absolute() else f"a/{path}",
        str(path) if path.is_absolute() else f"b/{path}",
    )
    for line in lines:
        yield line if line.endswith("\n") else line + "\n"


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _write(path: Path, code: str) -> None:
    # newline="" keeps the file's own line endings (libcst kept them in `code`).
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(code)


_SKIP_DIRS = {"__pycache__", "site-packages", "node_modules"}


def _python_files(paths: list[str]) -> Iterator[Path]:
    for name in paths:
        path = Path(name)
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(
                file
                for file in path.rglob("*.py")
                if file.is_file()
                and not any(
                    part.startswith(".") or part in _SKIP_DIRS
                    for part in file.relative_to(path).parts[:-1]
                )
            )
        else:
            raise CLIError(
                f"{name} does not exist.\nHINT: pass the .py files or directories to migrate."
            )
