"""The engine -> controller seam: every engine delivers the same typed messages for the same
worker code (thread, local processes, Ray actors), and resolves calls the same way.

Here rather than in tests/: the Ray case needs this directory's Ray fixture and leak check
(a module-scoped Ray, started before any test's leak snapshot, so every case asks for it).
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

from phalanx import ScalingConfig
from phalanx._internal.engines.base import Engine, WorkerGroupSpec, WorkerHandle
from phalanx._internal.engines.messages import Exited, Poll, Report, decode
from phalanx._internal.worker.runtime import RemoteCallError, current_outbox

pytestmark = pytest.mark.slow


def _engine(name: str) -> Engine:
    if name == "thread":
        from phalanx._internal.engines.thread import ThreadEngine

        return ThreadEngine()
    if name == "local":
        from phalanx._internal.engines.local.engine import LocalProcessEngine

        return LocalProcessEngine()
    from phalanx._internal.engines.ray.engine import RayEngine

    return RayEngine()


@pytest.fixture(params=["thread", "local", "ray"])
def worker(request: Any, local_ray: Any) -> Iterator[tuple[Engine, WorkerHandle, queue.Queue[Any]]]:
    engine = _engine(request.param)
    events: queue.Queue[Any] = queue.Queue()
    spec = WorkerGroupSpec(1, ScalingConfig(num_workers=1), "messages")
    try:
        (handle,) = engine.launch(spec, events)
        yield engine, handle, events
        engine.shutdown([handle], grace_s=2.0)
    finally:
        engine.close()


def _send_like_report() -> str:
    """What report() sends, as the worker's outbox gets it; the metrics change after sending."""
    outbox = current_outbox()
    assert outbox is not None
    metrics = {"loss": 0.5}
    outbox.send(("report", 0, metrics, None, 1.0))
    metrics["loss"] = 99.0  # a process pickled it already; a thread must have been given a copy
    outbox.send(("report", 1, {"loss": 0.25}, "checkpoint_000001", 2.0, {"validation": "v"}))
    outbox.send(("poll",))
    return "returned"


def _fail() -> None:
    raise KeyError("boom")


def _events(events: queue.Queue[Any], count: int, timeout_s: float = 30.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        try:
            got.append(events.get(timeout=0.1))
        except queue.Empty:
            continue
    return got


def test_every_engine_delivers_the_same_typed_events(worker):
    _, handle, events = worker
    assert handle.execute(_send_like_report).result(timeout=30) == "returned"
    assert _events(events, 3) == [
        (handle.index, Report(0, {"loss": 0.5}, None, 1.0)),
        (handle.index, Report(1, {"loss": 0.25}, "checkpoint_000001", 2.0, validation="v")),
        (handle.index, Poll()),
    ]
    with pytest.raises(RemoteCallError, match="boom") as info:
        handle.execute(_fail).result(timeout=30)
    assert info.value.remote.type_name == "KeyError"


def _send_unknown() -> str:
    outbox = current_outbox()
    assert outbox is not None
    outbox.send(("bogus", 1))
    return "returned"


def test_a_message_of_unknown_shape_fails_the_call_instead_of_vanishing(worker):
    """A worker of another phalanx version, say: its call fails naming the message; nothing
    waits for a report that was dropped."""
    _, handle, _ = worker
    with pytest.raises(RemoteCallError, match="does not know: 'bogus'"):
        handle.execute(_send_unknown).result(timeout=30)


@pytest.mark.parametrize("engine_name", ["local", "ray"])
def test_a_worker_process_that_exits_is_an_exited_event(engine_name, local_ray):
    engine = _engine(engine_name)
    events: queue.Queue[Any] = queue.Queue()
    try:
        (handle,) = engine.launch(WorkerGroupSpec(1, ScalingConfig(num_workers=1), "x"), events)
        call = handle.execute(os._exit, 3)
        ((index, event),) = _events(events, 1)
        assert index == handle.index and isinstance(event, Exited)
        # Ray does not tell exit codes: the actor died (-9), and its cause says why.
        assert event.returncode == (3 if engine_name == "local" else -9)
        assert (event.cause is None) == (engine_name == "local")
        with pytest.raises(ConnectionError):
            call.result(timeout=30)
        engine.shutdown([handle], grace_s=0.0)
    finally:
        engine.close()


def test_a_message_of_unknown_shape_is_refused_by_name():
    with pytest.raises(ValueError, match="'reprot'"):
        decode(("reprot", 0, {}, None, 1.0))
    with pytest.raises(ValueError, match="'report'"):  # a report missing its time
        decode(("report", 0, {}, None))
