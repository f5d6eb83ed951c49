"""Pass 1 of ``phalanx migrate``: find every Ray import and every use of what it binds, and plan
what each becomes (:class:`Plan`). Pass 2 (:mod:`phalanx.migrate._transform`) only applies it.

A use is a dotted chain of names whose head a Ray import binds (``ray.train.report``,
``train.report``, ``session.get_world_rank``); strings and comments are never uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import PositionProvider

from phalanx.migrate._resolve import Resolution, phalanx_module_of, resolve
from phalanx.migrate._rules import DEPRECATED, MODULES

__all__ = ["Attention", "Plan", "collect", "dotted_name"]

# ray.init() / ray.shutdown() as whole statements: removed when nothing else needs Ray.
_LIFECYCLE = ("ray.init", "ray.shutdown")


@dataclass(frozen=True)
class Attention:
    """Something left as it was that the user must look at: ``line``, the Ray ``name``, ``advice``.

    Example::

        migration = migrate_source("from ray import train\n")
        print(migration.code)  # import phalanx as train
        for item in migration.attention:
            print(item.line, item.name, item.advice)
    """

    line: int
    name: str
    advice: str


@dataclass
class Plan:
    """What pass 2 does to one file, decided from the whole file at once."""

    # binding name -> the Ray dotted path it is bound to (``train`` -> ``ray.train``).
    bindings: dict[str, str] = field(default_factory=dict)
    # binding name -> the phalanx path its import now binds, for bindings whose import is rewritten.
    rebound: dict[str, str] = field(default_factory=dict)
    # bindings whose import goes: every use is rewritten to a full phalanx expression.
    dropped: set[str] = field(default_factory=set)
    # chain node -> the code that replaces it.
    replace: dict[cst.CSTNode, str] = field(default_factory=dict)
    # statement lines (ray.init() / ray.shutdown()) to remove.
    remove: set[cst.SimpleStatementLine] = field(default_factory=set)
    # phalanx modules a rewritten chain needs imported, that the file does not import yet.
    imports: set[str] = field(default_factory=set)
    # Ray paths reached through ``ray`` itself that stay (Ray stays imported for them).
    ray_left: set[str] = field(default_factory=set)
    # ``import ray`` / ``import ray.x`` statements kept for ``ray_left``; whether to add one.
    keep_root: set[str] = field(default_factory=set)
    add_import_ray: bool = False
    # `from ray.x import *` -> the phalanx module that replaces ray.x.
    star: dict[str, str] = field(default_factory=dict)
    first_import_line: cst.SimpleStatementLine | None = None
    attention: list[Attention] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Use:
    node: cst.CSTNode
    binding: str
    parts: list[str]  # the full Ray path: the binding's path, then the chain's attributes
    line: int


def dotted_name(node: cst.BaseExpression) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None for anything but names and attributes."""
    if isinstance(node, cst.Name):
        return [node.value]
    if isinstance(node, cst.Attribute):
        head = dotted_name(node.value)
        return None if head is None else [*head, node.attr.value]
    return None


class _Collector(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.bindings: dict[str, str] = {}
        self.uses: list[_Use] = []
        self.lifecycle: dict[cst.SimpleStatementLine, _Use] = {}
        self.phalanx_imported: set[str] = set()
        self.root_imports: set[str] = set()
        self.binding_lines: dict[str, int] = {}
        self.stars: list[tuple[str, int]] = []
        self._definitions: set[cst.Name] = set()
        self.first_import_line: cst.SimpleStatementLine | None = None
        self._line: cst.SimpleStatementLine | None = None
        self._depth = 0
        self._first_is_top = False

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._line = node

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._line = None

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            module = ".".join(dotted_name(alias.name) or [])
            if (module == "phalanx" or module.startswith("phalanx.")) and alias.asname is None:
                self.phalanx_imported.add(module)
            if module == "ray" or module.startswith("ray."):
                self._found_import()
                if alias.asname is None:
                    self.root_imports.add(module)
                    self._bind("ray", "ray", node)
                else:
                    self._bind(_asname(alias), module, node)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        module = ".".join(dotted_name(node.module) or []) if node.module else ""
        if node.relative or not (module == "ray" or module.startswith("ray.")):
            return False
        self._found_import()
        if isinstance(node.names, cst.ImportStar):
            self.stars.append((module, self._pos(node)))
            return False
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else ""
            self._bind(_asname(alias) if alias.asname else name, f"{module}.{name}", node)
        return False

    def _bind(self, name: str, path: str, node: cst.CSTNode) -> None:
        self.bindings[name] = path
        self.binding_lines.setdefault(name, self._pos(node))

    def _found_import(self) -> None:
        # The new imports go where the first Ray import was, at module level if there is one
        # there (an import inside a function would not serve the module's own code).
        top = self._depth == 0 and self._line is not None
        if self.first_import_line is None or (top and not self._first_is_top):
            self.first_import_line = self._line
            self._first_is_top = top

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._depth += 1

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._depth -= 1

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if not self._record(node):
            node.value.visit(self)  # `x.ray`: the attribute's own name is no use of `ray`
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self._record(node)

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # `f(ray=...)`: a keyword is no use of `ray`
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        # `def f(session):` binds a new name: only its annotation and default are uses.
        for part in (node.annotation, node.default):
            if part is not None:
                part.visit(self)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._definitions.add(node.name)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._definitions.add(node.name)

    def visit_Expr(self, node: cst.Expr) -> None:
        call = node.value
        if isinstance(call, cst.Call) and self._line is not None and len(self._line.body) == 1:
            parts = dotted_name(call.func)
            if parts and parts[0] in self.bindings and self.bindings[parts[0]] == "ray":
                dotted = ".".join(parts)
                if dotted == "ray.shutdown" or (dotted == "ray.init" and not call.args):
                    self.lifecycle[self._line] = _Use(call.func, "ray", parts, self._pos(node))

    def _record(self, node: cst.Name | cst.Attribute) -> bool:
        parts = dotted_name(node)
        if not parts or parts[0] not in self.bindings or node in self._definitions:
            return False
        full = self.bindings[parts[0]].split(".") + parts[1:]
        self.uses.append(_Use(node, parts[0], full, self._pos(node)))
        return True

    def _pos(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line


def _asname(alias: cst.ImportAlias) -> str:
    assert alias.asname is not None
    target = alias.asname.name
    return target.value if isinstance(target, cst.Name) else ""


def collect(wrapper: cst.MetadataWrapper) -> Plan:
    """Plan the rewrite of the module in ``wrapper``."""
    collector = _Collector()
    wrapper.visit(collector)
    plan = Plan(bindings=collector.bindings, first_import_line=collector.first_import_line)
    resolved = [(use, resolve(use.parts)) for use in collector.uses]
    lifecycle_nodes = {use.node for use in collector.lifecycle.values()}
    _plan_rebinding(plan, resolved)
    for binding, path in plan.bindings.items():
        own = resolve(path.split("."))
        if own.kind == "UNSUPPORTED":
            line = collector.binding_lines[binding]
            plan.attention.append(Attention(line, path, own.advice))
    for module, line in collector.stars:
        own = resolve(module.split("."))
        if own.importable and module in MODULES:  # a module phalanx has whole
            plan.star[module] = own.target
        else:
            advice = f"import the names you use from {own.target}" if own.importable else own.advice
            plan.attention.append(Attention(line, f"{module}.*", advice or "no phalanx equivalent"))
    for use, res in resolved:
        if use.node not in lifecycle_nodes:
            _plan_use(plan, use, res)
    _plan_lifecycle(plan, collector)
    _note_deprecated(plan, collector, resolved)
    plan.keep_root = {
        module
        for module in collector.root_imports
        if plan.ray_left
        and (module == "ray" or any(_within(path, module) for path in plan.ray_left))
    }
    plan.add_import_ray = bool(plan.ray_left) and not plan.keep_root
    plan.imports -= collector.phalanx_imported
    plan.attention = sorted(set(plan.attention), key=lambda item: (item.line, item.name))
    return plan


def _note_deprecated(
    plan: Plan, collector: _Collector, resolved: list[tuple[_Use, Resolution]]
) -> None:
    """A note per line that names one of AIR's deprecated trainers (rewritten, still working)."""
    found = {
        (collector.binding_lines[binding], res.target)
        for binding, path in plan.bindings.items()
        if (res := resolve(path.split("."))).kind == "MAPPED"
    }
    found |= {(use.line, res.target) for use, res in resolved if res.kind == "MAPPED"}
    first: dict[str, int] = {}
    for line, target in sorted(found):
        if target in DEPRECATED:
            first.setdefault(target, line)  # once a name, at its first line
    for target, line in sorted(first.items(), key=lambda item: item[1]):
        plan.notes.append(f"{line}: {DEPRECATED[target]}")


def _within(path: str, module: str) -> bool:
    return path == module or path.startswith(f"{module}.")


def _plan_lifecycle(plan: Plan, collector: _Collector) -> None:
    if plan.ray_left:
        plan.ray_left.update("ray.init" for _ in collector.lifecycle)
    else:
        plan.remove.update(collector.lifecycle)
        for use in collector.lifecycle.values():
            plan.notes.append(f"{use.line}: removed {'.'.join(use.parts)}(): {_WHY[use.parts[-1]]}")


_WHY = {
    "init": "phalanx runs workers as local processes without Ray (keep ray.init(address=...) "
    "to run on a Ray cluster)",
    "shutdown": "nothing else in this file uses Ray",
}


def _plan_rebinding(plan: Plan, resolved: list[tuple[_Use, Resolution]]) -> None:
    """A binding's import is rewritten when it maps to a phalanx name and every use maps too."""
    for binding, path in plan.bindings.items():
        if path == "ray":
            continue
        own = resolve(path.split("."))
        uses = [res for use, res in resolved if use.binding == binding]
        if own.kind != "MAPPED" or not all(res.kind == "MAPPED" for res in uses):
            continue
        if own.importable and own.consumed == len(path.split(".")):
            plan.rebound[binding] = own.target
        else:  # `from ray.air.session import get_world_rank`: each use is rewritten in full
            plan.dropped.add(binding)


def _plan_use(plan: Plan, use: _Use, res: Resolution) -> None:
    if res.kind != "MAPPED":
        if plan.bindings[use.binding] == "ray":
            plan.ray_left.add(".".join(use.parts))
        if res.kind == "UNSUPPORTED":
            plan.attention.append(Attention(use.line, ".".join(use.parts), res.advice))
        return
    if isinstance(use.node, cst.Name) and use.binding not in plan.dropped:
        return  # the bare name: its import is rewritten, or kept (and so is the name)
    rest = "".join(f".{part}" for part in use.parts[res.consumed :])
    own = plan.rebound.get(use.binding)
    module = phalanx_module_of(res.target)
    if own is not None and (res.target == own or res.target.startswith(f"{own}.")):
        code = use.binding + res.target[len(own) :] + rest
        if module != phalanx_module_of(own):  # `train.lightning.X`: phalanx.lightning imported
            plan.imports.add(module)
    else:
        code = res.target + rest
        plan.imports.add(module)
    if code != cst.Module([]).code_for_node(use.node):
        plan.replace[use.node] = code
