"""The sweep's configuration, with Ray Tune's names: ``TuneConfig`` and tune's ``RunConfig``
(``FailureConfig`` and ``CheckpointConfig`` are phalanx's own, as Ray's are Train's)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phalanx._foundation.keywords import KeywordChecked
from phalanx.config import CheckpointConfig, FailureConfig
from phalanx.errors import ConfigError

__all__ = ["CheckpointConfig", "FailureConfig", "RunConfig", "TuneConfig"]


@dataclass(frozen=True)
class TuneConfig(KeywordChecked):
    """What the sweep searches for and how many trials it runs.

    ``max_concurrent_trials`` caps the trials running at once; without it the trials' own
    resources decide (a trial starts while the machine has room for its workers).
    ``time_budget_s``: once spent, no trial starts and each running one stops at its next
    report. ``reuse_actors`` is accepted for Ray scripts and changes nothing (trials are
    threads).

    Example::

        TuneConfig(metric="loss", mode="min", num_samples=16, scheduler=ASHAScheduler(max_t=8))
    """

    metric: str | None = None
    mode: str | None = None
    search_alg: Any = None
    scheduler: Any = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | None = None
    reuse_actors: bool | None = None
    trial_name_creator: Callable[[Any], str] | None = None
    trial_dirname_creator: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in ("min", "max"):
            raise ConfigError(
                f"TuneConfig(mode={self.mode!r}) is invalid: mode must be 'min' or 'max'."
            )
        if self.mode is not None and self.metric is None:
            raise ConfigError(
                f"TuneConfig(mode={self.mode!r}) has no metric.\nHINT: pass metric='<name>' "
                "of a metric your trials report."
            )
        if not isinstance(self.num_samples, int) or isinstance(self.num_samples, bool):
            raise ConfigError(f"TuneConfig(num_samples={self.num_samples!r}) must be an int.")
        if self.num_samples == 0 or self.num_samples < -1:
            raise ConfigError(
                f"TuneConfig(num_samples={self.num_samples}) must be >= 1 (or -1: until the "
                "search algorithm stops)."
            )
        limit = self.max_concurrent_trials
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ConfigError(
                f"TuneConfig(max_concurrent_trials={limit!r}) must be None or an int >= 1."
            )


@dataclass(frozen=True)
class RunConfig(KeywordChecked):
    """Where the sweep lives: ``<storage_path>/<name>/``, one run directory per trial in it.

    ``stop`` ends each trial when a result meets it (``{"training_iteration": 10}``: a result
    with a value >= 10) or when ``stop(trial_id, result)`` returns True. ``failure_config``'s
    ``max_failures`` retries a failed trial (from its latest checkpoint).

    Example::

        RunConfig(name="lr_sweep", storage_path="/mnt/sweeps", stop={"training_iteration": 8})
    """

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    stop: dict[str, Any] | Callable[[str, dict[str, Any]], bool] | None = None
    callbacks: list[Any] = field(default_factory=list)
    sync_config: Any = None
    verbose: int = 1
    log_to_file: bool = False

    def __post_init__(self) -> None:
        from phalanx.config._run import _check_run_name

        if self.name is not None:
            _check_run_name(self.name)
        if self.failure_config is None:
            object.__setattr__(self, "failure_config", FailureConfig())
        if self.checkpoint_config is None:
            object.__setattr__(self, "checkpoint_config", CheckpointConfig())
        if self.stop is not None and not (isinstance(self.stop, dict) or callable(self.stop)):
            raise ConfigError(
                f"RunConfig(stop={self.stop!r}) is invalid: it must be a dict of metric -> "
                "threshold or a function (trial_id, result) -> bool."
            )
