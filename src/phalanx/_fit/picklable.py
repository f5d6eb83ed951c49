"""Check at ``Trainer(...)`` that what the workers are sent pickles, naming the key that does not.

Unchecked, a value that cannot be pickled (a database connection, a lock, an open file) fails at
``fit()``, once workers are started and the run directory made, with cloudpickle's message and
no hint of which key holds it.

The check pickles into a sink that keeps nothing, and leaves buffers that support pickle
protocol 5 (numpy arrays, pandas columns) out of band: a 100 MB array costs microseconds, not a
copy of 100 MB.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from phalanx.errors import ConfigError


class _Sink:
    """A file that forgets what is written to it."""

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return len(memoryview(data))


def check_picklable(field: str, value: object) -> None:
    """Raise ConfigError naming the innermost dict key of ``value`` that cannot be pickled."""
    try:
        _dump(value)
    except Exception as exc:
        path, error = _culprit(value, exc)
        what = type(_lookup(value, path)).__name__
        raise ConfigError(
            f"{field}{''.join(f'[{k!r}]' for k in path)}: {error}. Every worker gets a pickled "
            f"copy of {field}, and this {what} cannot be pickled (connections, locks, open "
            "files, threads and CUDA streams cannot).\nHINT: build it inside the training "
            f"function (e.g. from a path or URL passed in {field}), once per worker."
        ) from exc


def _dump(value: object) -> None:
    # buffer_callback returning False: protocol-5 buffers are left out, not copied
    cloudpickle.CloudPickler(
        _Sink(), protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=lambda _buf: False
    ).dump(value)


def _culprit(value: object, error: Exception) -> tuple[tuple[object, ...], Exception]:
    """The path of keys to the innermost dict entry that fails to pickle, and its error."""
    path: tuple[object, ...] = ()
    while isinstance(value, dict):
        for key, item in value.items():
            try:
                _dump(item)
            except Exception as exc:
                path, value, error = (*path, key), item, exc
                break
        else:
            break  # every entry pickles on its own: the dict as a whole does not
    return path, error


def _lookup(value: Any, path: tuple[object, ...]) -> object:
    for key in path:
        value = value[key]
    return value
