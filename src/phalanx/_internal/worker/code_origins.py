"""Where the user's functions were written, carried with the pickled training function.

cloudpickle pickles a function from ``__main__`` (or from a module it cannot import by name)
by value. From cloudpickle 3.1.3 on, such a function's code is rebuilt in the worker with
``co_filename="<dynamic-code>"``: tracebacks then read ``File "<dynamic-code>", line 9`` with
no source line, and pdb cannot show the code. The driver records each function's file name
here; the worker puts it back (line numbers travel with the code) and hands linecache the
source of a file it cannot read itself (a notebook cell, a script on another machine), so
tracebacks, pdb and tools point at the user's source, as in Ray Train.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
from collections.abc import Callable, Iterator
from types import CodeType, FunctionType, MethodType
from typing import Any

import cloudpickle

# Source shipped for files the worker may not have; beyond this a traceback shows the file
# and line without the source text.
MAX_SOURCE_CHARS = 1_000_000
# Functions and classes visited from the training function (its globals, closures, methods).
_MAX_VISITED = 5_000

_CodeKey = tuple[str, str, int]  # qualname, name, first line


def dump_function(fn: Callable[..., object]) -> bytes:
    """``fn`` pickled with the file names (and sources) of the code it carries by value."""
    origins: dict[_CodeKey, str] = {}
    ambiguous: set[_CodeKey] = set()
    for code in _codes(fn):
        key = _key(code)
        if origins.setdefault(key, code.co_filename) != code.co_filename:
            ambiguous.add(key)
    for key in ambiguous:
        del origins[key]
    return bytes(cloudpickle.dumps((fn, origins, _sources(set(origins.values())))))


def load_function(payload: bytes) -> Callable[..., Any]:
    """The function :func:`dump_function` pickled, its code pointing at the user's files."""
    fn, origins, sources = cloudpickle.loads(payload)
    for filename, lines in sources.items():
        # A file this process cannot read: the driver's copy, kept (no mtime) even if a
        # forked worker inherited a cache entry that linecache would drop for the lost file.
        if not os.path.isfile(filename):
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    for func in _functions(fn):
        restored = _restored(func.__code__, origins)
        if restored is not func.__code__:
            func.__code__ = restored
    return fn  # type: ignore[no-any-return]


def _key(code: CodeType) -> _CodeKey:
    qualname = getattr(code, "co_qualname", code.co_name)  # Python 3.11+
    return (qualname, code.co_name, code.co_firstlineno)


def _restored(code: CodeType, origins: dict[_CodeKey, str]) -> CodeType:
    """``code`` with its real file name (and that of the code nested in it), or ``code``
    itself when nothing changes. Only a made-up name (``<dynamic-code>``) is replaced: a
    function imported in the worker names the worker's own file."""
    consts = tuple(_restored(c, origins) if isinstance(c, CodeType) else c for c in code.co_consts)
    changes: dict[str, Any] = {}
    if any(new is not old for new, old in zip(consts, code.co_consts, strict=True)):
        changes["co_consts"] = consts
    filename = origins.get(_key(code))
    if filename and filename != code.co_filename and code.co_filename.startswith("<"):
        changes["co_filename"] = filename
    return code.replace(**changes) if changes else code


def _codes(fn: object) -> Iterator[CodeType]:
    for func in _functions(fn):
        yield from _nested(func.__code__)


def _nested(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _nested(const)


def _functions(root: object) -> Iterator[FunctionType]:
    """The functions pickled by value with ``root``: itself, and what it reaches through its
    closure, defaults and the globals its code names, and the methods of classes it reaches."""
    seen: set[int] = set()
    stack = [root, type(root)]  # a callable object: its class's __call__
    while stack and len(seen) < _MAX_VISITED:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, MethodType | staticmethod | classmethod):
            stack.append(obj.__func__)
        elif isinstance(obj, functools.partial):
            stack.extend((obj.func, *obj.args, *obj.keywords.values()))
        elif isinstance(obj, property):
            stack.extend((obj.fget, obj.fset, obj.fdel))
        elif isinstance(obj, type) and _by_value(obj):
            stack.extend(vars(obj).values())
        elif isinstance(obj, FunctionType) and _by_value(obj):
            yield obj
            stack.extend(_referenced(obj))


def _referenced(func: FunctionType) -> Iterator[Any]:
    for cell in func.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    yield from func.__defaults__ or ()
    yield from (func.__kwdefaults__ or {}).values()
    names = {name for code in _nested(func.__code__) for name in code.co_names}
    yield from (func.__globals__[name] for name in names if name in func.__globals__)


def _by_value(obj: object) -> bool:
    """Whether cloudpickle copies ``obj``'s code rather than importing it by name."""
    should_import = getattr(cloudpickle.cloudpickle, "_should_pickle_by_reference", None)
    if should_import is not None:
        try:
            return not should_import(obj)
        except Exception:  # an object cloudpickle's own check cannot place
            return False
    module = getattr(obj, "__module__", None)
    return module == "__main__" or module not in sys.modules


def _sources(filenames: set[str]) -> dict[str, list[str]]:
    """The source lines of the files the worker may lack, within :data:`MAX_SOURCE_CHARS`."""
    sources: dict[str, list[str]] = {}
    budget = MAX_SOURCE_CHARS
    for filename in sorted(filenames):
        lines = linecache.getlines(filename)
        size = sum(map(len, lines))
        if lines and size <= budget:
            sources[filename] = lines
            budget -= size
    return sources
