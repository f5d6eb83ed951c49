"""ScalingConfig: how many workers, what each gets, where they run."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx._foundation.keywords import KeywordChecked
from phalanx.config._checks import _fail, _is_int, _is_number

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ENGINES = ("local", "ray", "thread")


def _check_num_workers(value: object) -> None:
    """An int >= 0, or ``(min_workers, max_workers)`` ints with 1 <= min <= max (elastic)."""
    if isinstance(value, tuple):
        if len(value) != 2 or not all(_is_int(v) for v in value):
            raise _fail(
                "ScalingConfig",
                "num_workers",
                value,
                "an integer >= 0 or a (min_workers, max_workers) tuple of two integers",
                "for elastic training pass two ints, e.g. num_workers=(2, 8).",
            )
        low, high = value
        if not 1 <= low <= high:
            raise _fail(
                "ScalingConfig",
                "num_workers",
                value,
                "(min_workers, max_workers) with 1 <= min_workers <= max_workers",
                f"swap or raise the bounds, e.g. num_workers=({max(1, min(value))}, "
                f"{max(1, *value)}).",
            )
        return
    if not _is_int(value) or value < 0:
        raise _fail(
            "ScalingConfig",
            "num_workers",
            value,
            "an integer >= 0 (0: run the training function in this process)",
        )


def _check_resources(cls: str, name: str, resources: object) -> None:
    """None or a dict of resource name to a number >= 0 (no bools, no NaN)."""
    if resources is None:
        return
    allowed = "None or a dict of resource name to a number >= 0"
    if not isinstance(resources, dict):
        raise _fail(cls, name, resources, allowed)
    for key, amount in resources.items():
        if not isinstance(key, str) or not key or not _is_number(amount) or not amount >= 0:
            raise _fail(cls, name, resources, allowed, f"{key!r}: {amount!r} is not allowed.")


@dataclass(frozen=True)
class ScalingConfig(KeywordChecked):
    """How many workers to start and what each one gets.

    Example::

        ScalingConfig(num_workers=4, use_gpu=True, resources_per_worker={"CPU": 2, "GPU": 1})

    ``engine`` picks where workers run: ``"local"`` (processes on this machine), ``"ray"`` (Ray
    actors) or ``"thread"`` (threads in the driver, for tests). ``None`` picks Ray when Ray is
    initialised or ``RAY_ADDRESS`` is set, local processes otherwise.

    ``num_workers=(min_workers, max_workers)`` is elastic training, as in Ray: on Ray each attempt
    starts with as many workers as the cluster can place (at most ``max_workers``, waiting while
    fewer than ``min_workers`` fit), and a node loss restarts the group, from the latest
    checkpoint, at the size that still fits. Locally the size is decided once at ``fit()`` from
    this machine's CPUs (GPUs with ``use_gpu=True``). Every ``elastic_resize_monitor_interval_s``
    a healthy group below ``max_workers`` restarts larger from the latest checkpoint when more
    workers fit (not a failure).
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    trainer_resources: dict[str, float] | None = None
    accelerator_type: str | None = None
    label_selector: dict[str, str] | list[dict[str, str]] | None = None
    use_tpu: bool = False
    topology: str | None = None
    elastic_resize_monitor_interval_s: float = 60.0
    engine: str | None = None

    def __post_init__(self) -> None:
        _check_num_workers(self.num_workers)
        from phalanx._foundation.config_checks import validate_placement_fields

        validate_placement_fields(self)
        if not isinstance(self.use_gpu, bool):
            raise _fail("ScalingConfig", "use_gpu", self.use_gpu, "True or False")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise _fail(
                "ScalingConfig",
                "placement_strategy",
                self.placement_strategy,
                f"one of {', '.join(PLACEMENT_STRATEGIES)}",
            )
        if self.engine is not None and self.engine not in ENGINES:
            raise _fail("ScalingConfig", "engine", self.engine, f"None or one of {ENGINES}")
        _check_resources("ScalingConfig", "trainer_resources", self.trainer_resources)
        accelerator = self.accelerator_type
        if accelerator is not None and (not isinstance(accelerator, str) or not accelerator):
            raise _fail(
                "ScalingConfig",
                "accelerator_type",
                accelerator,
                "None or an accelerator name such as 'A100'",
            )
        self._validate_resources()

    def _validate_resources(self) -> None:
        resources = self.resources_per_worker
        if resources is None:
            return
        _check_resources("ScalingConfig", "resources_per_worker", resources)
        gpus = resources.get("GPU", 0)
        if gpus > 0 and not self.use_gpu:
            raise _fail(
                "ScalingConfig",
                "resources_per_worker",
                resources,
                "without GPU when use_gpu=False",
                "set use_gpu=True to request GPUs.",
            )
        if self.use_gpu and "GPU" in resources and gpus == 0:
            raise _fail(
                "ScalingConfig", "resources_per_worker", resources, "with GPU > 0 when use_gpu=True"
            )

    @property
    def _resources_per_worker_not_none(self) -> dict[str, float]:
        if self.resources_per_worker is None:
            if self.use_tpu:
                return {"TPU": 1}
            return {"GPU": 1} if self.use_gpu else {"CPU": 1}
        resources = {k: v for k, v in self.resources_per_worker.items() if v != 0}
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        return resources

    @property
    def min_workers(self) -> int:
        n = self.num_workers
        return n[0] if isinstance(n, tuple) else n

    @property
    def max_workers(self) -> int:
        n = self.num_workers
        return n[1] if isinstance(n, tuple) else n

    @property
    def elasticity_enabled(self) -> bool:
        """``num_workers=(min, max)``: the group size is decided per attempt (elastic training)."""
        return isinstance(self.num_workers, tuple)

    @property
    def num_tpus_per_worker(self) -> float:
        return float(self._resources_per_worker_not_none.get("TPU", 0))

    @property
    def num_cpus_per_worker(self) -> float:
        return float(self._resources_per_worker_not_none.get("CPU", 0))

    @property
    def num_gpus_per_worker(self) -> float:
        return float(self._resources_per_worker_not_none.get("GPU", 0))

    @property
    def additional_resources_per_worker(self) -> dict[str, float]:
        return {
            k: v for k, v in self._resources_per_worker_not_none.items() if k not in ("CPU", "GPU")
        }

    @property
    def total_resources(self) -> dict[str, float]:
        """What the workers reserve in all (elastic: an upper bound, at max_workers, as in Ray)."""
        return {k: v * self.max_workers for k, v in self._resources_per_worker_not_none.items()}
