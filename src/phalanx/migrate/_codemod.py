"""One module's migration: parse, plan (pass 1), rewrite (pass 2)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from phalanx.migrate._collect import Attention, collect
from phalanx.migrate._transform import Rewriter

__all__ = ["Migration", "migrate_source"]


@dataclass(frozen=True)
class Migration:
    """One file's migration: the new ``code``, what needs the user (``attention``, by line) and
    what was done that the user should know (``notes``, ``"<line>: <what>"``).

    Example::

        migration = migrate_source("from ray import train\n")
        print(migration.code)  # import phalanx as train
        for item in migration.attention:
            print(item.line, item.name, item.advice)
    """

    code: str
    attention: tuple[Attention, ...]
    notes: tuple[str, ...]


def migrate_source(code: str) -> Migration:
    """Migrate one module's source. Raises ``libcst.ParserSyntaxError`` on invalid Python.

    Example::

        migration = migrate_source("from ray import train\n")
        print(migration.code)  # import phalanx as train
        for item in migration.attention:
            print(item.line, item.name, item.advice)
    """
    wrapper = cst.MetadataWrapper(cst.parse_module(code))
    plan = collect(wrapper)
    new = wrapper.module.visit(Rewriter(plan))
    return Migration(new.code, tuple(plan.attention), tuple(plan.notes))
