"""What a storage path holds, as the viewer sees it: its runs and its sweeps, and the one place a
name from a URL becomes a run directory.

A run id is ``<name>`` (a run directly under the storage path) or ``<sweep>/<trial>`` (a trial's
run inside a sweep's directory: a directory that is no run itself and holds runs). Each part
must be a plain directory name (no ``..``, no separator, so never an absolute path), and the run
must be a run directory the storage path holds; on a local filesystem its real path must also
stay inside the storage path's, so a symlink that leads out of the storage is refused.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx._foundation.fs.access import (
    is_local,
    resolve_filesystem,
    storage_error,
    storage_errors,
)
from phalanx._foundation.fs.paths import component_problem
from phalanx._internal.storage.reader import RunReader
from phalanx._internal.storage.run_record import RUN_FILE
from phalanx._internal.storage.run_storage import MARKER_FILE, SNAPSHOT_FILE, RunStorage

if TYPE_CHECKING:
    import fsspec

logger = logging.getLogger(__name__)

RUN_FILES = frozenset((SNAPSHOT_FILE, RUN_FILE, MARKER_FILE))
MAX_ID_PARTS = 2  # <name> or <sweep>/<trial>


class RunRefused(Exception):
    """A run id the viewer does not open: ``status`` 400 (not a plain name) or 404 (no such run,
    or one outside the storage path)."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Listing:
    """The runs directly under the storage path and the sweeps' trials (``{sweep: [run ids]}``)."""

    runs: list[str]
    sweeps: dict[str, list[str]]


@dataclass(frozen=True)
class StorageRoot:
    """The storage path the viewer serves (``shown`` as the user wrote it)."""

    shown: str
    filesystem: fsspec.AbstractFileSystem
    path: str
    real: str | None  # the real path of a local storage path; None on an object store

    @classmethod
    def open(cls, storage_path: str) -> StorageRoot:
        with storage_errors("open the storage at", storage_path):
            fs, path = resolve_filesystem(storage_path)
        path = path.rstrip("/") or "/"
        return cls(storage_path, fs, path, os.path.realpath(path) if is_local(fs) else None)

    @property
    def local(self) -> bool:
        return self.real is not None

    def exists(self) -> bool:
        if self.real is not None:
            return os.path.isdir(self.path)
        with storage_errors("open the storage at", self.shown):
            return bool(self.filesystem.isdir(self.path))

    # -- what is there --------------------------------------------------------------------------

    def listing(self) -> Listing:
        """Every run and sweep (a damaged or unreadable directory is skipped, not fatal)."""
        runs, sweeps = [], {}
        for name in self._directories(self.path):
            inside = self.names(self._join(self.path, name))
            if inside & RUN_FILES:
                runs.append(name)
                continue
            trials = [
                f"{name}/{trial}"
                for trial in sorted(self._directories(self._join(self.path, name)))
                if self.names(self._join(self.path, name, trial)) & RUN_FILES
            ]
            if trials:
                sweeps[name] = trials
        return Listing(sorted(runs), dict(sorted(sweeps.items())))

    def reader(self, run_id: str) -> RunReader:
        """The reader of the run ``run_id``, or RunRefused saying why there is none."""
        parts = parse_run_id(run_id)
        parent = self._join(self.path, *parts[:-1])
        run_path = self._join(parent, parts[-1])
        if self.real is not None:
            self._check_inside(run_id, run_path)
        if not self.names(run_path) & RUN_FILES:
            raise RunRefused(f"No run {run_id!r} in {self.shown!r}.")
        return RunReader(RunStorage.create(parent, parts[-1], self.filesystem), run_id)

    def inside(self, path: str) -> bool:
        """Whether local ``path``'s real path is the storage path's or below it."""
        if self.real is None:
            return True
        real = os.path.realpath(path)
        return real == self.real or real.startswith(self.real.rstrip("/") + "/")

    def _check_inside(self, run_id: str, run_path: str) -> None:
        if not self.inside(run_path):
            raise RunRefused(
                f"Refusing run {run_id!r}: its directory leads out of the storage path "
                f"{self.shown!r} (a symlink)."
            )

    @staticmethod
    def _join(base: str, *parts: str) -> str:
        return "/".join((base.rstrip("/"), *parts))  # the root: /name, not //name

    def _directories(self, path: str) -> list[str]:
        """Names of the directories in ``path`` (local: symlinks that lead out are left out)."""
        if self.real is not None:
            try:
                with os.scandir(path) as entries:
                    found = [e.name for e in entries if _is_dir(e)]
            except (FileNotFoundError, NotADirectoryError):
                return []
            except OSError as exc:
                raise storage_error("list", path, exc) from exc
            return [n for n in found if self.inside(os.path.join(path, n))]
        try:
            entries = self.filesystem.ls(path, detail=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise storage_error("list", path, exc) from exc
        return [
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            for e in entries
            if e.get("type") == "directory"
        ]

    def names(self, path: str) -> set[str]:
        """Names in directory ``path`` (empty when it is none)."""
        try:
            if self.real is not None:
                return set(os.listdir(path))
            listing = self.filesystem.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        except Exception as exc:
            logger.warning("Could not list %s: %s", path, exc)
            return set()
        return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in listing}


def parse_run_id(run_id: str) -> list[str]:
    """``run_id``'s parts, or RunRefused (400) when one is not a plain directory name."""
    parts = run_id.split("/") if isinstance(run_id, str) else []
    problems = [component_problem(part) for part in parts]
    if not parts or len(parts) > MAX_ID_PARTS or any(problems):
        why = next((p for p in problems if p), None) or f"it has {len(parts)} parts"
        raise RunRefused(
            f"Refusing the run {run_id!r}: {why}. A run is <name> or <sweep>/<trial>, each a "
            "plain directory name of the storage path.",
            status=400,
        )
    return parts


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
