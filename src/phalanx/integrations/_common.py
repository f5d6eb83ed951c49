"""What every tracker callback shares: optional imports, the run's output directory, metrics."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from numbers import Number
from typing import TYPE_CHECKING, SupportsFloat, cast

from phalanx._foundation import env
from phalanx._foundation.optional import require as require  # the trackers import it here
from phalanx._internal.storage.run_storage import RunStorage

if TYPE_CHECKING:
    from phalanx._foundation.goodput_parts import Goodput
    from phalanx.callbacks import TrainRunContext

logger = logging.getLogger(__name__)


def flatten(metrics: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Nested dicts become ``outer/inner`` keys, as Ray's loggers write them."""
    flat: dict[str, object] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def scalar(value: object) -> float | None:
    """A number a tracker can plot (bools, numpy scalars, 0-d tensors too), else None."""
    if isinstance(value, Number) and not isinstance(value, complex):
        return float(cast(SupportsFloat, value))  # a real Number: float() takes it
    item = getattr(value, "item", None)
    if callable(item):
        try:
            inner = item()
        except (TypeError, ValueError, RuntimeError):  # arrays with more than one element
            return None
        return scalar(inner) if isinstance(inner, Number) else None
    return None


def scalars(metrics: Mapping[str, object]) -> dict[str, float]:
    """The plottable entries of ``metrics`` (flattened); the rest is left to CSV/JSON."""
    out = {}
    for key, value in flatten(metrics).items():
        number = scalar(value)
        if number is not None:
            out[key] = number
    return out


def goodput_metrics(goodput: Goodput) -> dict[str, float]:
    """The goodput breakdown as tracker metrics: ``goodput/<part>_s`` seconds,
    ``goodput/wall_s`` and ``goodput/fraction`` (the productive share)."""
    values = {f"goodput/{part}_s": seconds for part, seconds in goodput.seconds.items()}
    values["goodput/wall_s"] = goodput.wall_s
    values["goodput/fraction"] = goodput.goodput
    return values


def run_storage(run_context: TrainRunContext) -> RunStorage:
    run_config = run_context.run_config
    return RunStorage.create(
        run_config.storage_path or env.default_storage_path(),
        run_context.run_name,
        run_config.storage_filesystem,
    )


class OutputDir:
    """A tracker's files in the run directory.

    On local storage they are written there directly. On remote storage they are written to a
    private local directory (seeded with what a resumed run already wrote) and uploaded with
    :meth:`sync` at checkpoints and at the end: trackers write files, object stores cannot append.
    """

    def __init__(self, run_context: TrainRunContext, relative: str) -> None:
        self.storage = run_storage(run_context)
        self.relative = relative
        if self.storage.local_path is not None:
            self._cache = None
            self.root = self.storage.local_path
        else:
            self._cache = tempfile.mkdtemp(prefix=f"phalanx-{run_context.run_name}-")
            self.root = self._cache
            remote = self.storage.path(relative)
            if self.storage.filesystem.exists(remote):
                self.storage.filesystem.get(remote, self.path, recursive=True)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)

    @property
    def path(self) -> str:
        return os.path.join(self.root, self.relative)

    def sync(self) -> None:
        if self._cache is None or not os.path.exists(self.path):
            return
        recursive = os.path.isdir(self.path)
        self.storage.filesystem.put(
            self.path.rstrip("/") + ("/" if recursive else ""),
            self.storage.path(self.relative),
            recursive=recursive,
        )

    def close(self) -> None:
        """Upload, then drop the private copy (never the run directory's files)."""
        self.sync()
        if self._cache is not None:
            shutil.rmtree(self._cache, ignore_errors=True)
            self._cache = None
