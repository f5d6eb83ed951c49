"""A trial: one config of the sweep, run as one phalanx run (a run directory of the sweep's),
and what the sweep keeps of it in its state file."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from phalanx.checkpoint import Checkpoint

__all__ = ["Trial"]

PENDING, RUNNING, TERMINATED, ERROR = "PENDING", "RUNNING", "TERMINATED", "ERROR"


@dataclass
class Trial:
    """One trial: its config, status, results and latest checkpoint (Ray Tune's ``Trial``)."""

    trial_id: str
    trial_name: str
    config: dict[str, Any]
    sweep_name: str
    sweep_path: str
    status: str = PENDING
    results: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_path: str | None = None
    # the filesystem the checkpoint is on where not local (a Train run's on S3): this process's
    checkpoint_filesystem: object | None = field(default=None, repr=False, compare=False)
    iterations_at_checkpoint: int = 0
    segment: int = 0  # how many times PopulationBasedTraining restarted it from another trial
    restore_path: str | None = None  # the checkpoint its next run starts from (an exploit)
    run_names: list[str] = field(default_factory=list)
    error: str | None = None
    num_failures: int = 0
    stopped_early: bool = False
    resources: dict[str, float] = field(default_factory=dict)
    started: float = 0.0
    time_total_s: float = 0.0

    @property
    def last_result(self) -> dict[str, Any]:
        return self.results[-1] if self.results else {}

    @property
    def iterations(self) -> int:
        return len(self.results)

    @property
    def checkpoint(self) -> Checkpoint | None:
        if not self.checkpoint_path:
            return None
        return Checkpoint(self.checkpoint_path, self.checkpoint_filesystem)

    @property
    def run_name(self) -> str:
        """The run this trial's next ``fit()`` writes (a new one after each exploit: a run
        resumes from its own latest checkpoint, an exploited trial must not)."""
        return self.trial_name if self.segment == 0 else f"{self.trial_name}-{self.segment}"

    @property
    def run_path(self) -> str:
        return f"{self.sweep_path.rstrip('/')}/{self.run_names[-1] if self.run_names else self.run_name}"

    def is_finished(self) -> bool:
        return self.status in (TERMINATED, ERROR)

    def exploit(self, donor: Trial, config: dict[str, Any]) -> None:
        """PopulationBasedTraining: go on from ``donor``'s latest checkpoint with ``config``."""
        self.config = config
        self.restore_path = donor.checkpoint_path
        self.iterations_at_checkpoint = self.iterations
        self.segment += 1

    def begin(self) -> None:
        self.status = RUNNING
        self.started = time.time() - self.time_total_s

    def to_json(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "trial_name": self.trial_name,
            "config": self.config,
            "status": self.status,
            "results": self.results,
            "checkpoint_path": self.checkpoint_path,
            "iterations_at_checkpoint": self.iterations_at_checkpoint,
            "segment": self.segment,
            "restore_path": self.restore_path,
            "run_names": self.run_names,
            "error": self.error,
            "num_failures": self.num_failures,
            "stopped_early": self.stopped_early,
            "resources": self.resources,
            "time_total_s": self.time_total_s,
            "iterations": self.iterations,
            "last_result": self.last_result,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], sweep_name: str, sweep_path: str) -> Trial:
        keys = {
            "trial_id", "trial_name", "config", "status", "results", "checkpoint_path",
            "iterations_at_checkpoint", "segment", "restore_path", "run_names", "error",
            "num_failures", "stopped_early", "resources", "time_total_s",
        }  # fmt: skip
        return cls(
            sweep_name=sweep_name,
            sweep_path=sweep_path,
            **{k: v for k, v in data.items() if k in keys},
        )
