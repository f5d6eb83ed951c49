"""``phalanx profile``'s files in a run directory, and the worker's side of a ``--torch`` capture.

The driver writes ``<run>/profile/workers.json`` when an attempt's workers are up: each rank's
host and pid, so that the CLI knows which process to point py-spy at. With ``--torch`` the CLI
asks a rank for a ``torch.profiler`` trace of its next steps by writing
``<run>/profile/rank-<R>.request`` (``{"id": ..., "steps": N}``); the rank looks for that file
from ``report()``, at most once a second (one ``stat``), takes it, profiles its next N reports'
steps and writes ``<run>/profile/rank-<R>-<id>.trace.json`` (a Chrome trace: chrome://tracing,
Perfetto, TensorBoard). When torch is not imported in the rank's process, the rank writes
``rank-<R>-<id>.declined`` instead (the CLI says so; py-spy's flame graph is still taken).
Nothing on remote storage (the files are on the run's host).

The capture is torch.profiler's lightest that still shows what one reads in a trace: every
operator and its time (CPU, and CUDA kernels where there is a GPU), and each step as a
``ProfilerStep#N`` span from one ``report()`` to the next; no shapes, stacks, memory or FLOPs
(each costs per operator: bench/anatomy_profile.py), and no Python event objects built when it
stops (``trace_only``: only the Chrome trace is wanted). What is left is torch.profiler's own
cost per operator recorded, about 1 us here: ~3 % of a 10 ms step of 170 operators, ~12 % of a
7 ms transformer layer's step of 900 (B17c).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from types import ModuleType
from typing import Any

__all__ = [
    "PROFILE_DIR",
    "ProfileWatch",
    "declined_path",
    "request_path",
    "trace_path",
    "workers_path",
]

logger = logging.getLogger(__name__)

PROFILE_DIR = "profile"
CHECK_EVERY_S = 1.0


def workers_path(run_dir: str) -> str:
    return os.path.join(run_dir, PROFILE_DIR, "workers.json")


def request_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, PROFILE_DIR, f"rank-{rank}.request")


def trace_path(run_dir: str, rank: int, request_id: str) -> str:
    return os.path.join(run_dir, PROFILE_DIR, f"rank-{rank}-{request_id}.trace.json")


def declined_path(run_dir: str, rank: int, request_id: str) -> str:
    """Written instead of the trace by a rank whose training function does not use torch."""
    return os.path.join(run_dir, PROFILE_DIR, f"rank-{rank}-{request_id}.declined")


def write_workers(run_dir: str | None, attempt: int, workers: list[Any]) -> None:
    """``workers``: each rank's WorkerMetadata, in rank order (the driver, at attempt start)."""
    if run_dir is None:
        return
    path = workers_path(run_dir)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rows = [
            {"rank": rank, "host": w.host, "pid": w.pid, "node_id": w.node_id}
            for rank, w in enumerate(workers)
        ]
        with open(path + ".tmp", "w") as f:
            json.dump({"attempt": attempt, "workers": rows}, f)
        os.replace(path + ".tmp", path)
    except OSError as exc:  # a read-only run directory: phalanx profile cannot find the ranks
        logger.debug("could not write %s: %s", path, exc)


class ProfileWatch:
    """One rank's watch for a profile request; ``poll()`` from every ``report()``."""

    def __init__(self, run_dir: str | None, rank: int) -> None:
        self.request = request_path(run_dir, rank) if run_dir is not None else None
        self.run_dir = run_dir
        self.rank = rank
        self._next_check = 0.0
        self._profiler: Any = None
        self._steps_left = 0
        self._id = ""

    def poll(self) -> None:
        if self._profiler is not None:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._stop()
            else:
                self._profiler.step()  # the trace's ProfilerStep#N: one report() to the next
            return
        if self.request is None:
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        if not os.path.exists(self.request):
            return
        try:
            with open(self.request) as f:
                asked = json.load(f)
            os.remove(self.request)
        except (OSError, ValueError):
            return
        self._start(str(asked.get("id", "")), int(asked.get("steps", 10)))

    def _start(self, request_id: str, steps: int) -> None:
        torch = sys.modules.get("torch")
        if torch is None:  # a training function without torch: say so to `phalanx profile`
            assert self.run_dir is not None
            try:
                open(declined_path(self.run_dir, self.rank, request_id), "w").close()
            except OSError:
                pass
            return
        profiler = torch.profiler  # torch as the training function imported it

        activities = [profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(profiler.ProfilerActivity.CUDA)
        self._profiler = profiler.profile(
            activities=activities,
            schedule=_record,  # a schedule makes torch.profiler mark each step()
            experimental_config=_trace_only(profiler),
        )
        self._profiler.__enter__()
        self._steps_left, self._id = max(1, steps), request_id

    def _stop(self) -> None:
        profiler, self._profiler = self._profiler, None
        assert self.run_dir is not None
        try:
            profiler.__exit__(None, None, None)
            path = trace_path(self.run_dir, self.rank, self._id)
            profiler.export_chrome_trace(path + ".tmp")
            os.replace(path + ".tmp", path)
        except Exception as exc:  # a failed capture never fails training
            logger.warning("phalanx profile: the torch.profiler trace failed: %s", exc)

    def close(self) -> None:
        """The training function returned during a capture: write what was captured."""
        if self._profiler is not None:
            self._stop()


def _record(step: int) -> object:
    return sys.modules["torch"].profiler.ProfilerAction.RECORD


def _trace_only(profiler: ModuleType) -> object | None:
    """torch.profiler's config that skips building Python event objects at the end
    (``trace_only``, in recent torch); None, torch's default, on a torch without it."""
    try:
        return profiler._ExperimentalConfig(trace_only=True)
    except (AttributeError, TypeError):
        return None
