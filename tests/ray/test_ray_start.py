"""Starting a Ray worker group: the actors are requested with the placement group, before it is
placed, and the start timeout still counts from the placement (tests/ray/test_ray_engine.py has
the rest: infeasible requests, the waiting message, storage checks)."""

from __future__ import annotations

import queue
import threading
import time

import pytest

pytest.importorskip("ray")

from phalanx import ScalingConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

START_TIMEOUT_S = 8.0


def test_a_group_placed_after_longer_than_the_start_timeout_still_starts(tmp_path):
    """The actors wait (queued by Ray) while other work holds the CPUs; once the placement group
    is placed they start, and the wait did not eat their start timeout."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from phalanx._internal.engines.base import WorkerGroupSpec
    from phalanx._internal.engines.ray.engine import RayEngine

    blocker = placement_group([{"CPU": 4}])  # local_ray has 4 CPUs: none left for the workers
    ray.get(blocker.ready(), timeout=30)
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})
    spec = WorkerGroupSpec(2, scaling, "start", start_timeout_s=START_TIMEOUT_S)
    engine = RayEngine()
    outcome: queue.Queue = queue.Queue()

    def launch() -> None:
        try:
            outcome.put(engine.launch(spec, queue.Queue()))
        except BaseException as exc:
            outcome.put(exc)

    started = time.monotonic()
    runner = threading.Thread(target=launch)
    runner.start()
    handles = []
    try:
        # Held past the start timeout: counted from the request, the start would have failed.
        time.sleep(START_TIMEOUT_S + 1.0)
        assert outcome.empty(), "the group started while its resources were held"
        remove_placement_group(blocker)
        runner.join(START_TIMEOUT_S + 60)
        handles = outcome.get_nowait()
        assert not isinstance(handles, BaseException), handles
        assert time.monotonic() - started > START_TIMEOUT_S
        pids = {h.metadata.pid for h in handles}
        assert len(pids) == 2 and None not in pids
        assert all(h.execute(lambda: 40 + 2).result(timeout=30) == 42 for h in handles)
    finally:
        remove_placement_group(blocker)
        runner.join(60)
        engine.shutdown(handles, 1.0)
        engine.close()
