"""Pass 2 of ``phalanx migrate``: apply a :class:`~phalanx.migrate._collect.Plan` to the tree.

Only the nodes the plan names change; libcst keeps every comment, blank line and format around
them. An import whose names all move to one phalanx module keeps its layout (parentheses,
trailing commas, comments): only its module changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from phalanx.migrate._collect import Plan, dotted_name

__all__ = ["Rewriter"]

_Small = cst.BaseSmallStatement
_WITH_LEADING_LINES = (
    cst.SimpleStatementLine,
    cst.FunctionDef,
    cst.ClassDef,
    cst.If,
    cst.For,
    cst.While,
    cst.With,
    cst.Try,
)


class Rewriter(cst.CSTTransformer):
    """Rewrites Ray imports and uses as ``plan`` says."""

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan
        self._block_done = False
        # Lines that were removed, until their block passes their leading lines on.
        # id -> the removed line itself: an id names one object only while that object lives, and
        # a line freed here could share its id with a statement built later
        self._removed: dict[int, cst.SimpleStatementLine] = {}

    # Uses.

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._replaced(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._replaced(original_node, updated_node)

    def _replaced(
        self, original: cst.Name | cst.Attribute, updated: cst.Name | cst.Attribute
    ) -> cst.BaseExpression:
        code = self.plan.replace.get(original)
        if code is None:
            return updated
        new = cst.parse_expression(code)
        return new.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    # Statements.

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        if original_node in self.plan.remove:
            return self._removal(updated_node)
        smalls: list[_Small] = []
        for small in updated_node.body:
            smalls.extend(self._small(small))
        if original_node is self.plan.first_import_line:
            smalls.extend(self._block())
        if smalls == list(updated_node.body):
            return updated_node
        if not smalls:
            return self._removal(updated_node)
        if len(updated_node.body) > 1:
            body = [s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in smalls]
            return updated_node.with_changes(body=body)
        lines: list[cst.BaseStatement] = [updated_node.with_changes(body=[smalls[0]])]
        lines += [cst.SimpleStatementLine(body=[small]) for small in smalls[1:]]
        return cst.FlattenSentinel(lines)

    def _removal(self, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        """A marker for a removed line; its block drops it and keeps its blank lines/comments."""
        self._removed[id(line)] = line
        return line

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = self._drop_removed(updated_node.body)
        # Everything in the block was removed (`if ...:\n    ray.init()`): it still needs a body.
        return updated_node.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._drop_removed(updated_node.body)
        block = self._block()
        if block:
            at = _after_preamble(body)
            new = [cst.SimpleStatementLine(body=[small]) for small in block]
            body = [*body[:at], *new, *body[at:]]
        return updated_node.with_changes(body=body)

    def _drop_removed(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """``body`` without the removed lines; the statement after one takes over their comments,
        and their blank lines when it has none of its own."""
        out: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        for statement in body:
            if self._removed.get(id(statement)) is statement:
                carried += statement.leading_lines
                continue
            if carried and isinstance(statement, _WITH_LEADING_LINES):
                own = list(statement.leading_lines)
                if own and not any(line.comment for line in carried):
                    carried = []  # blank lines only: the next statement's own spacing wins
                statement = statement.with_changes(leading_lines=carried + own)
            carried = []
            out.append(statement)
        return out

    def _block(self) -> list[_Small]:
        """The imports the rewritten uses need, once per file, where the first Ray import was."""
        if self._block_done:
            return []
        self._block_done = True
        block: list[_Small] = [_import(module) for module in sorted(self.plan.imports)]
        if self.plan.add_import_ray:
            block.append(_import("ray"))
        return block

    # Imports.

    def _small(self, small: _Small) -> Sequence[_Small]:
        if isinstance(small, cst.Import):
            return self._import(small)
        if isinstance(small, cst.ImportFrom):
            return self._import_from(small)
        return [small]

    def _import(self, node: cst.Import) -> list[_Small]:
        names: list[cst.ImportAlias] = []
        for alias in node.names:
            module = ".".join(dotted_name(alias.name) or [])
            if not (module == "ray" or module.startswith("ray.")):
                names.append(alias)
            elif alias.asname is None:
                if module in self.plan.keep_root:
                    names.append(alias)
            else:
                bound = _bound(alias)
                target = self.plan.rebound.get(bound)
                names.append(alias if target is None else alias.with_changes(name=_dotted(target)))
        if not names:
            return []
        if names == list(node.names):
            return [node]
        return [node.with_changes(names=_commas(names))]

    def _import_from(self, node: cst.ImportFrom) -> list[_Small]:
        module = ".".join(dotted_name(node.module) or []) if node.module else ""
        if node.relative or not (module == "ray" or module.startswith("ray.")):
            return [node]
        if isinstance(node.names, cst.ImportStar):
            star = self.plan.star.get(module)
            return [node if star is None else node.with_changes(module=_dotted(star))]
        kept: list[cst.ImportAlias] = []
        moved: dict[str, list[cst.ImportAlias]] = {}
        whole: list[_Small] = []
        for alias in node.names:
            if _bound(alias) in self.plan.dropped:
                continue
            target = self.plan.rebound.get(_bound(alias))
            if target is None:
                kept.append(alias)
                continue
            parent, _, last = target.rpartition(".")
            if not parent:  # `from ray import train` -> `import phalanx as train`
                whole.append(
                    cst.Import(names=[cst.ImportAlias(_dotted(target), _as(_bound(alias)))])
                )
                continue
            renamed = None if last == _bound(alias) else _as(_bound(alias))
            moved.setdefault(parent, []).append(
                alias.with_changes(name=cst.Name(last), asname=renamed)
            )
        if not kept and not whole and len(moved) == 1:
            ((parent, aliases),) = moved.items()
            if [a.name.value for a in aliases] == [_name(a) for a in node.names]:
                return [node.with_changes(module=_dotted(parent))]  # keeps the layout
        out: list[_Small] = [
            cst.ImportFrom(module=_dotted(parent), names=_commas(aliases))
            for parent, aliases in moved.items()
        ]
        out += whole
        if kept:
            out.append(cst.ImportFrom(module=node.module, names=_commas(kept)))
        return out


def _after_preamble(body: list[cst.BaseStatement]) -> int:
    """The index after a module docstring and ``from __future__`` imports."""
    at = 0
    for statement in body:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            break
        small = statement.body[0]
        docstring = (
            at == 0 and isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString)
        )
        future = (
            isinstance(small, cst.ImportFrom)
            and isinstance(small.module, cst.Name)
            and small.module.value == "__future__"
        )
        if not (docstring or future):
            break
        at += 1
    return at


def _import(module: str) -> cst.Import:
    return cst.Import(names=[cst.ImportAlias(_dotted(module))])


def _dotted(path: str) -> cst.Attribute | cst.Name:
    expr = cst.parse_expression(path)
    assert isinstance(expr, cst.Attribute | cst.Name)
    return expr


def _as(name: str) -> cst.AsName:
    return cst.AsName(cst.Name(name))


def _name(alias: cst.ImportAlias) -> str:
    return alias.name.value if isinstance(alias.name, cst.Name) else ""


def _bound(alias: cst.ImportAlias) -> str:
    """The name an import binds: its ``as`` name, else its own (``ray`` for ``import ray.x``)."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return (dotted_name(alias.name) or [""])[0]


def _commas(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
    """The aliases with default commas: a trailing comma is valid only inside parentheses."""
    return [alias.with_changes(comma=cst.MaybeSentinel.DEFAULT) for alias in aliases]
