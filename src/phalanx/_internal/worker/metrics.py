"""What ``report()`` accepts as metrics: checked on the worker, where the mistake is made.

Metrics travel to the driver and are stored as JSON (``metrics.jsonl``, the snapshot), so a value
is accepted only if JSON holds it exactly and ``Result.from_path`` gives back what ``fit()``
returned. Numpy scalars, 0-d arrays and arrays become Python numbers and lists (exact: a
``np.float32`` becomes the float with the same value); tuples become lists. Anything else JSON
cannot hold (datetime, set, bytes, objects) is refused with the key and a HINT, as are non-string
keys and the keys phalanx writes into every history row itself.

The common case, a flat dict of str keys and int/float/str/bool values, costs one type lookup per
item; only other values take the slow path.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RESERVED_METRIC_KEYS", "checked_metrics"]

# Written by phalanx into every row of metrics.jsonl (history.py: AUTO_FILLED). ("rank", in the
# all-ranks history, is left to users: reporting one's own rank is common and the values agree.
# Its attempt column has a name no user writes: "attempt" is a common metric, and Ray's.)
RESERVED_METRIC_KEYS = frozenset(
    {"training_iteration", "timestamp", "checkpoint_dir_name", "_phalanx_attempt"}
)

_PLAIN = frozenset({float, int, str, bool, type(None)})
_MAX_DEPTH = 64

_HINTS = {
    "datetime": "report value.isoformat() or value.timestamp() instead.",
    "date": "report value.isoformat() instead.",
    "set": "report sorted(value) (a list) instead.",
    "frozenset": "report sorted(value) (a list) instead.",
    "bytes": "decode it (value.decode()) or save the bytes in the checkpoint instead.",
    "bytearray": "decode it (value.decode()) or save the bytes in the checkpoint instead.",
}


def checked_metrics(metrics: object) -> dict[str, Any]:
    """``metrics`` itself when it is plain; a converted copy when it holds numpy values or
    tuples. Raises TypeError (not a dict) or ValueError (a key or value that cannot be kept)."""
    if type(metrics) is not dict:
        if not isinstance(metrics, dict):
            raise TypeError(f"report() takes a dict of metrics, got {type(metrics).__name__}.")
        metrics = dict(metrics)
    converted: dict[str, Any] | None = None
    for key, value in metrics.items():
        if type(key) is not str or key in RESERVED_METRIC_KEYS:
            _refuse_key(key)
        if type(value) in _PLAIN:
            continue
        new = _convert(value, key, 1)
        if new is not value:
            if converted is None:
                converted = dict(metrics)
            converted[key] = new
    return metrics if converted is None else converted


def _refuse_key(key: object) -> None:
    if type(key) is not str:
        raise ValueError(
            f"Metric key {key!r} is a {type(key).__name__}; metric names must be strings (the "
            "metrics are stored as JSON).\nHINT: use a string key, e.g. "
            f"{'/'.join(map(str, key)) if isinstance(key, tuple) else str(key)!r}."
        )
    raise ValueError(
        f"Metric key {key!r} is reserved: phalanx writes it into every row of the metrics "
        f"history itself (reserved: {', '.join(sorted(RESERVED_METRIC_KEYS))}).\n"
        f"HINT: report it under another name, e.g. 'my_{key}'."
    )


def _convert(value: Any, key: str, depth: int) -> Any:
    """``value`` made JSON-exact (the same object when already so), or ValueError."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if depth > _MAX_DEPTH:
        raise ValueError(f"Metric {key!r} is nested more than {_MAX_DEPTH} levels deep.")
    if kind.__module__ == "numpy":
        return _convert(value.tolist() if hasattr(value, "tolist") else value.item(), key, depth)
    if isinstance(value, dict):
        return _convert_dict(value, key, depth)
    if isinstance(value, list | tuple):
        items = [_convert(v, key, depth + 1) for v in value]
        same = kind is list and all(a is b for a, b in zip(items, value, strict=True))
        return value if same else items
    if isinstance(value, float | int | str) and not isinstance(value, bool):
        # a subclass (an IntEnum, a str subclass) would come back from JSON as the base type
        if isinstance(value, str):
            return str.__str__(value)  # the characters, not str() of an Enum ("Color.RED")
        return float(value) if isinstance(value, float) else int(value)
    raise _refuse_value(value, key)


def _convert_dict(value: dict[Any, Any], key: str, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    changed = type(value) is not dict
    for inner, item in value.items():
        if type(inner) is not str:
            raise ValueError(
                f"Metric {key!r} holds the key {inner!r} ({type(inner).__name__}); keys of "
                "nested metric dicts must be strings too.\nHINT: use string keys."
            )
        out[inner] = _convert(item, f"{key}/{inner}", depth + 1)
        changed = changed or out[inner] is not item
    return out if changed else value


def _refuse_value(value: object, key: str) -> ValueError:
    kind = type(value)
    if kind.__module__.split(".")[0] == "torch":
        # Ray Train's own words (train/v2 report()), so users switching recognise the error.
        return ValueError(
            f"Metric {key!r} is a {kind.__name__}: passing objects containing Torch tensors as "
            "metrics is not supported as it will throw an exception on deserialization.\n"
            "HINT: convert the tensors to Python objects (ex: `.item()`, `.tolist()`) or save "
            "tensors as part of the checkpoint files instead."
        )
    hint = _HINTS.get(kind.__name__, "convert it to a number, string, list or dict of those.")
    return ValueError(
        f"Metric {key!r} = {_short(value)} is a {kind.__module__}.{kind.__qualname__}, which "
        "the metrics history (JSON) cannot hold exactly, so Result.from_path would give back "
        f"something else.\nHINT: {hint}"
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
