"""The controller asks the engine to keep a failed attempt's survivors (``Engine.park``: the Ray
engine's in-place recovery) only when a retry follows; a failure that ends the run stops every
worker, so no survivor is kept, and no one waits for it to end its call."""

from __future__ import annotations

from pathlib import Path

from controller_stepper import FakeEngine, Stepper
from test_failure_policy import run_script

from phalanx import FailureConfig
from phalanx._internal.engines.base import WorkerHandle


class ParkRecorder(FakeEngine):
    """Records how each failed attempt's workers were stopped: parked, or shut down."""

    def __init__(self) -> None:
        super().__init__()
        self.stops: list[str] = []

    def park(self, handles: list[WorkerHandle]) -> None:
        self.stops.append("park")
        super().park(handles)

    def shutdown(self, handles: list[WorkerHandle], grace_s: float) -> None:
        self.stops.append("shutdown")
        super().shutdown(handles, grace_s)


def test_a_failure_with_a_retry_left_parks_and_the_last_one_shuts_down(tmp_path: Path):
    engine = ParkRecorder()
    stepper = Stepper(tmp_path, failure_config=FailureConfig(max_failures=1), engine=engine)
    decisions = run_script(stepper, ["raise", "raise"])
    assert decisions == ["retry", "raise"]
    # Engine.park's default shuts the workers down: "park" then its "shutdown"
    assert engine.stops == ["park", "shutdown", "shutdown"]
    stepper.abandon()


def test_a_preemption_parks_on_its_own_budget(tmp_path: Path):
    engine = ParkRecorder()
    config = FailureConfig(max_failures=0, max_preemption_failures=1)
    stepper = Stepper(tmp_path, failure_config=config, engine=engine)
    decisions = run_script(stepper, ["preempt", "raise"])
    assert decisions == ["retry", "raise"]
    assert engine.stops == ["park", "shutdown", "shutdown"]
    stepper.abandon()
