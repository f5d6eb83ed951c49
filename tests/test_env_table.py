"""`phalanx._foundation.env.VARIABLES` is the one table of phalanx's environment variables: every
PHALANX_* name the module reads has a row, every row is read, each row's default is the one its
reader applies, and the docs page generated from the table is current."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from phalanx._foundation import env

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(env.__file__).read_text()
PAGE = ROOT / "docs" / "guides" / "environment-variables.md"


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "PHALANX_..."`` constants (readers name a variable through them)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _is_environ_get(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and ast.unparse(node.func.value) == "os.environ"
    )


def _string(node: ast.AST | None, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def reads() -> dict[str, str | None]:
    """``{name: default}`` of every ``os.environ.get("PHALANX_...", default)`` in env.py, the
    default being the literal passed, or the literal after ``or`` (``get(X) or "127.0.0.1"``);
    an empty default is None (unset)."""
    tree = ast.parse(SOURCE)
    constants = _constants(tree)
    fallbacks: dict[int, str] = {}
    for node in ast.walk(tree):  # get(...) or <default>: the default is the literal after `or`
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            later = [c for v in node.values[1:] for c in ast.walk(v)]
            literal = next((c.value for c in later if _string(c, {}) is not None), None)
            for call in filter(_is_environ_get, ast.walk(node.values[0])):
                if literal is not None:
                    fallbacks[id(call)] = literal
    found: dict[str, str | None] = {}
    for node in filter(_is_environ_get, ast.walk(tree)):
        assert isinstance(node, ast.Call)
        name = _string(node.args[0], constants)
        if name is None or not name.startswith("PHALANX_"):
            continue
        default = _string(node.args[1], constants) if len(node.args) > 1 else None
        found[name] = default or fallbacks.get(id(node)) or None
    return found


def test_every_variable_env_py_reads_is_in_the_table_with_the_default_its_reader_applies():
    table = {v.name: v.default for v in env.VARIABLES}
    read = reads()
    assert len(read) >= 15, read  # the scan finds the readers (a change of style would hide them)
    assert set(read) - set(table) == set(), "add a Variable row for each of these"
    assert set(table) - set(read) == set(), "rows no reader in env.py reads"
    assert {n: d for n, d in read.items() if table[n] != d} == {}, "defaults differ from the table"
    assert len(table) == len(env.VARIABLES), "a variable has two rows"


def test_no_phalanx_variable_is_named_outside_a_reader():
    """A PHALANX_* string anywhere in env.py (a constant, a docstring) is in the table: a name
    spelled there but read some other way would be missed by the scan above."""
    import re

    named = set(re.findall(r"PHALANX_[A-Z0-9_]+", SOURCE))
    assert named - {v.name for v in env.VARIABLES} == set()


def test_the_docs_page_is_generated_from_the_table():
    spec = importlib.util.spec_from_file_location("gen_env_page", ROOT / "docs" / "gen_env_page.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert PAGE.read_text() == module.render(), (
        "docs/guides/environment-variables.md is stale: "
        "python docs/gen_env_page.py > docs/guides/environment-variables.md"
    )
    for variable in env.VARIABLES:
        assert f"`{variable.name}`" in PAGE.read_text()
