"""Misspelt keyword arguments name the argument meant: ``RunConfig(chekpoint_config=...)``.

Python's own message (``__init__() got an unexpected keyword argument 'chekpoint_config'``)
names neither the class nor the right spelling. The check runs in ``__new__``, before the
``__init__`` that a dataclass generates after the class body, so one base class covers every
config dataclass and every trainer. A constructor taking ``**kwargs`` is not checked.
"""

from __future__ import annotations

import difflib
import inspect
import weakref
from typing import TypeVar

from phalanx.errors import UnknownArgumentError

_Checked = TypeVar("_Checked", bound="KeywordChecked")


class KeywordChecked:
    """Base of public classes whose keyword arguments are checked before ``__init__`` runs."""

    def __new__(cls: type[_Checked], *args: object, **kwargs: object) -> _Checked:
        if kwargs:
            names = accepted_keywords(cls)
            if names is not None:
                unknown = [key for key in kwargs if key not in names]
                if unknown:
                    raise UnknownArgumentError(unknown_message(cls.__name__, unknown, names))
        return super().__new__(cls)


# Per class; weak, as trainer classes may be made at run time (one per Transformers class)
_accepted: weakref.WeakKeyDictionary[type, frozenset[str] | None] = weakref.WeakKeyDictionary()


def accepted_keywords(cls: type) -> frozenset[str] | None:
    """The keyword arguments ``cls(...)`` takes; None when any is (``**kwargs``: the class
    may hand them on, e.g. XGBoostTrainer's to ``xgboost.train``)."""
    try:
        return _accepted[cls]
    except KeyError:
        names = _accepted[cls] = _keywords(cls)
        return names


def _keywords(cls: type) -> frozenset[str] | None:
    try:
        params = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params if p.kind in kinds) - {"self"}


def unknown_message(owner: str, unknown: list[str], names: frozenset[str]) -> str:
    public = sorted(name for name in names if not name.startswith("_"))
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, public, n=1)
        parts.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    noun = "argument" if len(unknown) == 1 else "arguments"
    return (
        f"{owner}() got an unexpected keyword {noun} {', '.join(parts)}.\n"
        f"{owner} takes: {', '.join(public)}.\nHINT: use one of these names."
    )
