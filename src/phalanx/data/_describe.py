"""Short descriptions of user values for error messages: a message names a value, never a row."""

from __future__ import annotations

import reprlib

__all__ = ["describe_value", "shorten"]

_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4


def describe_value(value: object) -> str:
    """``value``'s type and a repr cut to about 60 characters (lists to 4 items)."""
    shape = getattr(value, "shape", None)
    size = f", shape {tuple(shape)}" if shape is not None else ""
    if isinstance(value, list | tuple | dict):
        size = f", {len(value)} items"
    return f"{type(value).__name__}{size}: {_REPR.repr(value)}"


def shorten(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters (a library message may quote a whole row)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more chars)"
