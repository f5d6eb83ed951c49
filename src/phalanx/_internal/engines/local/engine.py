"""LocalProcessEngine: workers are processes on this machine, forked from a fork server (or
started as new interpreters by a spawn server: see ``start_method.py``).

One driver thread (the pump) watches every worker's control socket and output pipes: it resolves
call futures, forwards reports to the events queue, and writes each output line, prefixed with
the rank, to the driver's stdout/stderr and the rank's log file. The driver's side of one worker
is ``handle.LocalWorkerHandle``; this module starts, stops and signals the group.

In-place recovery (:meth:`LocalProcessEngine.park`): when a worker process of a failed attempt
died, the survivors keep their processes, for a backend that can both reset a worker and free
one stuck in a collective (``reset_worker`` and ``abort_worker``: TorchBackend; without a backend
the training function's own state, such as a process group it made, could not be reset). Each ends its training call, kills what the call started and leaves the framework's
process group (the backend's ``reset_worker``; ``abort_worker`` first frees a call stuck in a
collective with the dead peer), see ``worker_main``; a survivor that does not manage within
``PHALANX_REUSE_STOP_S`` is killed like the lost ones. The next launch forks new workers only for
the lost indices, and every rank restarts the training function in the process it has (imports,
CUDA context and caches kept). ``PHALANX_RESTORE_MODE=full`` replaces every worker instead.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from phalanx._foundation import env as env_vars
from phalanx._foundation.env import NOTICE_FILE_VAR, START_METHOD_VAR
from phalanx._internal.engines.base import Engine, WorkerGroupSpec, WorkerHandle, WorkerMetadata
from phalanx._internal.engines.local import warm_server
from phalanx._internal.engines.local.forkserver import ForkServer, SpawnedForkServer, main_imports
from phalanx._internal.engines.local.handle import LocalWorkerHandle
from phalanx._internal.engines.local.pump import OutputPump
from phalanx._internal.engines.local.resources import check_local_resources, local_gpu_ids
from phalanx._internal.engines.local.spawn import SpawnServer
from phalanx._internal.engines.local.start_method import SPAWN, StartMethod, choose_start_method
from phalanx._internal.engines.messages import Events
from phalanx._internal.engines.process_tree import is_running, kill_descendants
from phalanx._internal.engines.rank_output import RankOutput
from phalanx._internal.worker.runtime import RemoteException
from phalanx.config import ScalingConfig
from phalanx.errors import WorkerStartupError

logger = logging.getLogger(__name__)

RESET_SLACK_S = 5.0  # past the worker's own bound: the answer's way back

START_HINT = (
    "check the driver's stderr above for the cause (out of memory, a crash while forking); "
    "raise PHALANX_WORKER_START_TIMEOUT_S if starting is only slow. The attempt is retried "
    "under FailureConfig(max_failures=...)."
)


class LocalProcessEngine(Engine):
    """Workers as local processes. The fork (or spawn) server lives from the first launch to
    close()."""

    name = "local"
    process_per_worker = True
    applies_runtime_env = True

    def __init__(self) -> None:
        self._server: ForkServer | SpawnServer | None = None
        self._start_method: StartMethod | None = None
        self._pump: OutputPump | None = None
        self._by_pid: dict[int, LocalWorkerHandle] = {}
        self._early_exits: dict[int, int] = {}
        self._notice_dir: str | None = None
        self._preloaded: set[str] = set()
        self._starting: list[LocalWorkerHandle] = []
        self._spec: WorkerGroupSpec | None = None  # the last launch's
        self._parked: dict[int, LocalWorkerHandle] = {}  # survivors kept for the next launch

    def check(self, scaling_config: ScalingConfig) -> None:
        check_local_resources(scaling_config)
        if self._server is None:  # a running server stays: its workers are safe to start
            self._start_method = choose_start_method()

    def launch(self, spec: WorkerGroupSpec, events: Events) -> list[WorkerHandle]:
        """Start the workers; any failure to do so is a :class:`WorkerStartupError` (retried by
        the failure policy), after everything this launch started is gone."""
        self._starting = []
        self._spec = spec
        parked, self._parked = self._parked, {}
        try:
            self._start_server()
            gpu_ids = local_gpu_ids(spec.scaling_config)
            for index in range(spec.num_workers):
                kept = parked.pop(index, None)
                if kept is not None:
                    self._starting.append(self._rebind(kept, spec, events))
                else:
                    self._starting.append(self._spawn(index, spec, events, gpu_ids[index]))
            if parked:  # not part of this launch
                self.shutdown(list(parked.values()), 0.0)
            self._await_hellos(self._starting, spec, gpu_ids)
        except BaseException as exc:
            self._abort_launch()
            if isinstance(exc, WorkerStartupError) or not isinstance(exc, Exception):
                raise
            why = f"the {self._server_label} failed: {type(exc).__name__}: {exc}"
            raise WorkerStartupError.of(list(range(spec.num_workers)), why, START_HINT) from exc
        handles, self._starting = self._starting, []
        self._preload(spec.preload_modules)
        return list(handles)

    def _rebind(
        self, handle: LocalWorkerHandle, spec: WorkerGroupSpec, events: Events
    ) -> LocalWorkerHandle:
        """A survivor of the last attempt serves this one (its hello is answered already)."""
        assert self._pump is not None
        handle.rebind(events)
        self._pump.rebind_output(handle.index, RankOutput(handle, spec.log_dir, spec.attempt))
        return handle

    def park(self, handles: list[WorkerHandle]) -> None:
        """Keep the survivors of a failed attempt for the next launch (the module's docstring);
        stop the others at once."""
        local = [h for h in handles if isinstance(h, LocalWorkerHandle)]
        spec = self._spec
        # A rank killed a moment ago may not have been reaped yet (its exit notice comes from
        # the fork server): /proc says it is gone or a zombie already, as a survivor's error
        # from a collective with it can arrive first; taken as alive, "nobody lost" below
        # would replace every process.
        alive = [
            h
            for h in local
            if h.is_alive() and h.broken is None and is_running(h.metadata.pid or -1)
        ]
        if (
            spec is None
            or spec.reset_worker is None
            or spec.abort_worker is None  # a survivor in a collective could not be freed
            or env_vars.restore_mode() == "full"
            or not alive
            or len(alive) == len(local)  # nobody lost: a failure in code, restart afresh
        ):
            self.shutdown(handles, 0.0)
            return
        timeout_s = env_vars.reuse_stop_s()
        started = time.monotonic()
        futures = {h: h.reset(timeout_s, spec.reset_worker, spec.abort_worker) for h in alive}
        kept, why = [], {}
        deadline = started + timeout_s + RESET_SLACK_S
        for handle, future in futures.items():
            try:
                ok, reason = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                ok, reason = False, f"{type(exc).__name__}: {exc}" if str(exc) else repr(exc)
            if ok and handle.is_alive():
                kept.append(handle)
            else:
                why[handle.rank] = reason or "it died"
        self.shutdown([h for h in local if h not in kept], 0.0)
        self._parked = {h.index: h for h in kept}
        _log_reuse(kept, len(local), why, time.monotonic() - started)

    def _start_server(self) -> None:
        if self._server is not None and not self._server.alive:
            raise ConnectionError(f"it died (pid {self._server.pid}) after the last attempt")
        if self._server is None:
            if self._start_method is None:
                self._start_method = choose_start_method()
            self._server = self._new_server(self._start_method)
        if self._pump is not None and not self._pump.alive:
            self._pump.stop()
            self._pump = None
        if self._pump is None:
            self._pump = OutputPump()
        if self._notice_dir is None:
            self._notice_dir = tempfile.mkdtemp(prefix="phalanx-notice-")

    def _new_server(self, method: StartMethod) -> ForkServer | SpawnServer:
        callbacks: dict[str, Any] = {"on_exit": self._on_exit, "on_death": self._on_server_death}
        if not method.fresh_fork_server:
            warm_server.shut_down()  # kept for a driver that no longer needs it (ray.shutdown())
        if method.name != SPAWN:
            return ForkServer(**callbacks)
        if method.fresh_fork_server:
            try:
                return warm_server.take(**callbacks, modules=main_imports())
            except OSError as exc:
                logger.warning(
                    "Could not start a fresh fork server (%s): each worker starts as a new "
                    "interpreter instead (slower to start).\nHINT: check the driver's stderr "
                    "above for the server's error; %s=spawn skips it.",
                    exc,
                    START_METHOD_VAR,
                )
        return SpawnServer(**callbacks)

    def _preload(self, modules: tuple[str, ...]) -> None:
        wanted = tuple(m for m in modules if m not in self._preloaded)
        if wanted and self._server is not None:
            # The server is idle while these workers run: import for the next ones.
            try:
                self._server.preload(wanted)
            except OSError:  # the server died; the next launch starts another one
                return
            self._preloaded.update(wanted)

    def _on_server_death(self) -> None:
        """The fork server died (its reader thread): workers not started yet never will be."""
        error = ConnectionError(f"the {self._server_label} died before the worker started")
        for handle in list(self._starting):
            if not handle.hello.done():
                handle.hello.set_exception(error)
        # Its workers die with it (parent-death signal), and no one reports their exit now.
        for handle in list(self._by_pid.values()):
            if handle.returncode is None:
                handle.on_exit(-signal.SIGKILL)

    def _abort_launch(self) -> None:
        """Undo a failed launch: its workers, and the fork server, which may be the cause (the
        next launch forks a new one)."""
        started, self._starting = self._starting, []
        for handle in started:
            handle.kill(force=True)
        self._stop_server()
        if self._pump is not None:
            for handle in started:
                self._pump.remove_worker(handle.index, timeout_s=0.2)
                handle.stack_file.close()
        for handle in started:
            if handle.metadata.pid is not None:
                self._by_pid.pop(handle.metadata.pid, None)
        self._preloaded.clear()

    @property
    def _server_label(self) -> str:
        if self._server is not None:
            return self._server.label
        method = self._start_method.name if self._start_method is not None else "fork"
        return SpawnServer.label if method == SPAWN else ForkServer.label

    def _stop_server(self, park: bool = False) -> None:
        """Stop the server; ``park``: a fresh fork server waits for the next fit() instead."""
        if self._server is not None:
            kill_descendants(self._server.pid)
            if park and isinstance(self._server, SpawnedForkServer):
                warm_server.give_back(self._server)
            else:
                self._server.stop()
            self._server = None

    def _spawn(
        self, index: int, spec: WorkerGroupSpec, events: Events, gpu_ids: tuple[int, ...]
    ) -> LocalWorkerHandle:
        assert self._server is not None and self._pump is not None
        driver_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        handle = LocalWorkerHandle(index, Connection(driver_end.detach()), events)
        env = dict(spec.env)
        env[NOTICE_FILE_VAR] = self._notice_path
        if spec.scaling_config.use_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
        fds = [worker_end.fileno(), out_w, err_w, handle.stack_file.fileno()]
        self._server.spawn(index, fds, env)
        worker_end.close()
        os.close(out_w)
        os.close(err_w)
        self._pump.add_worker(
            index,
            handle.conn,
            out_r,
            err_r,
            RankOutput(handle, spec.log_dir, spec.attempt),
            on_message=handle.on_message,
            on_disconnect=handle.on_disconnect,
            on_error=handle.on_error,
        )
        return handle

    def _await_hellos(
        self,
        handles: list[LocalWorkerHandle],
        spec: WorkerGroupSpec,
        gpu_ids: list[tuple[int, ...]],
    ) -> None:
        deadline = time.monotonic() + spec.start_timeout_s
        for handle in handles:
            try:
                pid, host = handle.hello.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                late = [h.index for h in handles if not h.hello.done() or h.hello.exception()]
                why = f"no hello within {spec.start_timeout_s:g} s ({exc!r})"
                raise WorkerStartupError.of(late, why, START_HINT) from exc
            handle.metadata = WorkerMetadata(host, "local", pid, gpu_ids[handle.index])
            self._by_pid[pid] = handle
            if pid in self._early_exits:
                handle.on_exit(self._early_exits.pop(pid))

    def _on_exit(self, pid: int, returncode: int) -> None:
        handle = self._by_pid.get(pid)
        if handle is None:
            self._early_exits[pid] = returncode
        else:
            handle.on_exit(returncode)

    def shutdown(self, handles: list[WorkerHandle], grace_s: float) -> None:
        """``grace_s > 0``: ask each worker to exit, SIGKILL what is left after ``grace_s``.
        ``grace_s == 0`` (a failed attempt): SIGKILL each worker's process group at once. There
        is nothing left to save (commits happen on the driver), a rank stuck in a collective
        ignores SIGTERM, and a worker's SIGTERM handler means "preempted", not "stop"."""
        local = [h for h in handles if isinstance(h, LocalWorkerHandle)]
        if grace_s > 0:
            for handle in local:
                handle.send_exit()
            _wait_until(lambda: not any(h.is_alive() for h in local), grace_s)
        for handle in local:
            handle.kill(force=True)
        _wait_until(lambda: not any(h.is_alive() for h in local), 5.0)
        if self._server is not None:  # what the workers started outside their process groups
            others = {p for p, h in self._by_pid.items() if h not in local and h.is_alive()}
            kill_descendants(self._server.pid, frozenset(others))
        assert self._pump is not None
        for handle in local:
            self._pump.remove_worker(handle.index)
            handle.stack_file.close()
            if handle.metadata.pid is not None:
                self._by_pid.pop(handle.metadata.pid, None)

    @property
    def _notice_path(self) -> str:
        assert self._notice_dir is not None
        return os.path.join(self._notice_dir, "notice.json")

    def collect_stacks(self, handles: list[WorkerHandle], timeout_s: float) -> dict[int, str]:
        """SIGUSR1 makes each worker's faulthandler write all its threads' stacks, even from
        inside C code (a stuck collective); read them once the files stop growing."""
        local = [h for h in handles if isinstance(h, LocalWorkerHandle) and h.is_alive()]
        before = {h.index: os.fstat(h.stack_file.fileno()).st_size for h in local}
        for handle in local:
            handle.signal_worker(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        sizes: dict[int, int] = {}
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = {h.index: os.fstat(h.stack_file.fileno()).st_size for h in local}
            if now == sizes and all(now[i] > before[i] for i in now):
                break
            sizes = now
        stacks = {}
        for handle in local:
            handle.stack_file.seek(before[handle.index])
            stacks[handle.index] = handle.stack_file.read().decode("utf-8", "replace")
        return stacks

    def notify_preemption(self, handles: list[WorkerHandle], notice: dict[str, Any]) -> None:
        tmp = self._notice_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(notice, f)
        os.replace(tmp, self._notice_path)
        for handle in handles:
            if isinstance(handle, LocalWorkerHandle):
                handle.signal_worker(signal.SIGUSR2)

    def close(self) -> None:
        if self._parked:  # kept for a next attempt that never came
            parked: list[WorkerHandle] = list(self._parked.values())
            self._parked = {}
            self.shutdown(parked, 0.0)
        if self._notice_dir is not None:
            shutil.rmtree(self._notice_dir, ignore_errors=True)
            self._notice_dir = None
        self._stop_server(park=True)
        if self._pump is not None:
            self._pump.stop()
            self._pump = None


def _log_reuse(
    kept: list[LocalWorkerHandle], total: int, why: dict[int, str], took_s: float
) -> None:
    detail = "".join(f"\n  rank {rank}: {reason}" for rank, reason in sorted(why.items()))
    if not kept:
        logger.warning(
            "In-place recovery: no worker process can be kept; all are replaced.%s", detail
        )
        return
    logger.warning(
        "In-place recovery: keeping the worker processes of rank(s) %s (%d of %d, reset in "
        "%.2f s); the others are replaced.%s",
        sorted(h.rank for h in kept),
        len(kept),
        total,
        took_s,
        detail,
    )


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.002)


__all__ = ["LocalProcessEngine", "RemoteException"]
