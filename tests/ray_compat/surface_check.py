"""Compare a Ray module's public surface with the matching phalanx module.

Reusable for every framework module (torch, xgboost, lightgbm, and later Lightning, Hugging
Face, TensorFlow, JAX) and for the AIR-era names::

    table = load_differences()
    problems, used = check_module(ray.train.torch, phalanx.torch, table)
    assert not problems

A name *matches* when the phalanx object exists and, for functions and classes, its signature is
compatible: Ray's positional parameters come first, in Ray's order, with the same names; every
Ray keyword-only parameter exists (its position cannot matter to a caller); defaults are equal
(a parameter Ray requires is required in phalanx too, or the difference is documented); the
``*args`` and ``**kwargs`` Ray takes, phalanx takes too; every extra phalanx parameter has a
default (an extra keyword a Ray script never passes). Public methods, properties and enum members a Ray class defines are compared the same way.

Not compared, because a Ray user cannot rely on them: parameters whose Ray default is the string
``"DEPRECATED"`` and members Ray marks ``@Deprecated`` (Ray raises when they are used), and signatures Ray leaves open
(``(*args, **kwargs)``). A phalanx ``dataclasses.field(default_factory=...)`` default matches a
Ray default of ``None`` (Ray builds the same default object from the ``None``).

Each difference is a *problem key*: ``ray.train.Name`` (missing), ``ray.train.Name(param)`` (a
parameter missing or different) or ``ray.train.Name.member`` (a class member missing or
different). A row of the differences table excuses the keys equal to it or under it; a row
``ray.train.Name(*)`` excuses every parameter of that signature.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import types
from pathlib import Path
from typing import Any

DIFFERENCES_DOC = Path(__file__).resolve().parents[2] / "docs" / "ray_differences.md"
DEPRECATED = "DEPRECATED"
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.+)\|(.+)\|\s*$")


def load_differences(path: Path = DIFFERENCES_DOC) -> dict[str, tuple[str, str]]:
    """The table of deliberate differences: Ray name -> (reason, what to use instead)."""
    table = {}
    for line in path.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match:
            name, reason, instead = match.groups()
            table[name] = (reason.strip(), instead.strip())
    return table


def check_module(
    ray_module: types.ModuleType,
    phalanx_module: types.ModuleType,
    table: dict[str, tuple[str, str]],
    names: list[str] | None = None,
) -> tuple[list[str], set[str]]:
    """Undocumented differences (problem keys with a description), and the table rows used.

    ``names`` defaults to ``ray_module.__all__``.
    """
    label = ray_module.__name__
    problems: list[str] = []
    for name in names if names is not None else ray_module.__all__:
        key = f"{label}.{name}"
        if not hasattr(phalanx_module, name):
            problems.append(f"{key}: missing from {phalanx_module.__name__}")
            continue
        problems += compare_objects(key, getattr(ray_module, name), getattr(phalanx_module, name))
    undocumented, used = [], set()
    for problem in problems:
        row = excusing_row(problem.split(": ", 1)[0], table)
        if row is None:
            undocumented.append(problem)
        else:
            used.add(row)
    return undocumented, used


def excusing_row(key: str, table: dict[str, Any]) -> str | None:
    for row in table:
        if key == row or key.startswith((row + ".", row + "(")):
            return row
        if row.endswith("(*)") and key.startswith(row[:-2]):  # every parameter of a signature
            return row
    return None


def compare_objects(key: str, ray_obj: Any, phx_obj: Any) -> list[str]:
    if isinstance(ray_obj, type) and issubclass(ray_obj, enum.Enum):
        return _compare_enums(key, ray_obj, phx_obj)
    if isinstance(ray_obj, type):
        return _compare_signatures(key, ray_obj, phx_obj) + _compare_members(key, ray_obj, phx_obj)
    if callable(ray_obj):
        return _compare_signatures(key, ray_obj, phx_obj)
    if ray_obj != phx_obj:
        return [f"{key}: Ray has {ray_obj!r}, phalanx {phx_obj!r}"]
    return []


def _compare_enums(key: str, ray_enum: type[enum.Enum], phx_obj: Any) -> list[str]:
    if not (isinstance(phx_obj, type) and issubclass(phx_obj, enum.Enum)):
        return [f"{key}: not an Enum in phalanx"]
    problems = [
        f"{key}.{member}: enum member missing"
        for member in ray_enum.__members__
        if member not in phx_obj.__members__
    ]
    return problems + _compare_members(key, ray_enum, phx_obj)


def _ray_members(cls: type) -> dict[str, Any]:
    """Public members Ray itself defines on ``cls`` (not those of builtins or Enum)."""
    members: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("ray"):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and not isinstance(value, enum.Enum):
                members[name] = value
            if _ray_deprecated(value):
                members.pop(name, None)
    for f in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
        members.pop(f.name, None)  # fields are compared as constructor parameters
    return members


def _ray_deprecated(value: Any) -> bool:
    """Marked ``@Deprecated`` by Ray (it raises when called): not part of the contract."""
    for obj in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
        kind = getattr(obj, "_annotated_type", None)
        if kind is not None and getattr(kind, "name", "") == "DEPRECATED":
            return True
    return False


def _has_member(cls: Any, name: str) -> bool:
    if hasattr(cls, name):
        return True
    return dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}


def _compare_members(key: str, ray_cls: type, phx_cls: Any) -> list[str]:
    problems = []
    for name, value in _ray_members(ray_cls).items():
        member_key = f"{key}.{name}"
        if not _has_member(phx_cls, name):
            problems.append(f"{member_key}: member missing")
            continue
        function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
        if inspect.isfunction(function):
            phx_value = inspect.getattr_static(phx_cls, name)
            if isinstance(phx_value, classmethod | staticmethod):
                phx_value = phx_value.__func__
            if not callable(phx_value):
                problems.append(f"{member_key}: not callable in phalanx")
                continue
            drop = 0 if isinstance(value, staticmethod) else 1
            problems += _compare_signatures(member_key, function, phx_value, drop)
    return problems


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _compare_signatures(key: str, ray_obj: Any, phx_obj: Any, drop: int = 0) -> list[str]:
    ray_sig, phx_sig = _signature(ray_obj), _signature(phx_obj)
    if ray_sig is None:
        return []
    if phx_sig is None:
        return [f"{key}: phalanx's signature cannot be read"]
    ray_params = [p for p in list(ray_sig.parameters.values())[drop:] if p.default != DEPRECATED]
    phx_params = list(phx_sig.parameters.values())[drop:]
    if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in ray_params):
        return []  # Ray leaves it open
    return compare_params(key, ray_params, phx_params)


def compare_params(
    key: str, ray_params: list[inspect.Parameter], phx_params: list[inspect.Parameter]
) -> list[str]:
    """The problems of ``phx_params`` against Ray's ``ray_params`` (the rules: module doc)."""
    problems = []
    phx_by_name = {p.name: p for p in phx_params}
    ray_positional = [p.name for p in ray_params if p.kind in _POSITIONAL]
    phx_positional = [p.name for p in phx_params if p.kind in _POSITIONAL]
    if phx_positional[: len(ray_positional)] != ray_positional:
        problems.append(
            f"{key}(*): positional parameters differ: Ray {ray_positional}, phalanx {phx_positional}"
        )
    accepts_any_keyword = any(p.kind is p.VAR_KEYWORD for p in phx_params)
    for ray_p in ray_params:
        if ray_p.kind in _VARIADIC:
            if not any(p.kind is ray_p.kind for p in phx_params):
                star = "**" if ray_p.kind is ray_p.VAR_KEYWORD else "*"
                problems.append(f"{key}({star}{ray_p.name}): Ray takes it, phalanx does not")
            continue
        phx_p = phx_by_name.get(ray_p.name)
        if phx_p is None:
            if not accepts_any_keyword:
                problems.append(f"{key}({ray_p.name}): parameter missing")
            continue
        if not _same_default(ray_p.default, phx_p.default, ray_p.name):
            problems.append(
                f"{key}({ray_p.name}): default differs: Ray {_show(ray_p.default)}, "
                f"phalanx {_show(phx_p.default)}"
            )
    for phx_p in phx_params:
        extra = phx_p.name not in {p.name for p in ray_params}
        if extra and phx_p.default is phx_p.empty and phx_p.kind not in _VARIADIC:
            problems.append(f"{key}({phx_p.name}): phalanx-only parameter without a default")
    return problems


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


# (parameter, Ray's default) -> a phalanx default that means the same.
EQUIVALENT_DEFAULTS = {("num_boost_round", 10): None}  # None means 10, as in Ray 2.60


def _same_default(ray_default: Any, phx_default: Any, name: str = "") -> bool:
    empty = inspect.Parameter.empty
    if (name, ray_default) in EQUIVALENT_DEFAULTS:
        return phx_default in (ray_default, EQUIVALENT_DEFAULTS[(name, ray_default)])
    if ray_default is empty or phx_default is empty:
        return ray_default is phx_default
    if ray_default is None and repr(phx_default) == "<factory>":
        return True
    if isinstance(ray_default, enum.Enum) and isinstance(phx_default, enum.Enum):
        return ray_default.name == phx_default.name
    try:
        return bool(ray_default == phx_default) and type(ray_default) is type(phx_default)
    except Exception:
        return False


def _show(default: Any) -> str:
    return "(required)" if default is inspect.Parameter.empty else repr(default)


def import_ray_horovod() -> None:
    """Import ``ray.train.horovod`` to read its signatures, with or without Horovod installed.

    Its modules import ``horovod`` (which no longer builds against current PyTorch) only for
    names used at run time. Without Horovod, empty stand-ins are imported in its place and
    removed again: nothing of Horovod is called, only Ray's classes are inspected.
    """
    import importlib
    import sys

    try:
        importlib.import_module("horovod")
    except ImportError:
        pass
    else:
        importlib.import_module("ray.train.horovod")
        return
    names = ["horovod", "horovod.ray", "horovod.ray.runner", "horovod.ray.utils"]
    names += ["horovod.runner", "horovod.runner.common", "horovod.runner.common.util"]
    stand_ins = {name: types.ModuleType(name) for name in names}
    stand_ins["horovod.ray.runner"].Coordinator = object  # type: ignore[attr-defined]
    stand_ins["horovod.ray.utils"].detect_nics = None  # type: ignore[attr-defined]
    stand_ins["horovod.ray.utils"].nics_to_env_var = None  # type: ignore[attr-defined]
    util = stand_ins["horovod.runner.common.util"]
    util.secret = util.timeout = types.ModuleType("stand_in")  # type: ignore[attr-defined]
    sys.modules.update(stand_ins)
    try:
        importlib.import_module("ray.train.horovod")
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)
