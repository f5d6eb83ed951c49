"""``DataConfig(execution_options=...)``: Ray Data's ExecutionOptions, honoured where they mean
something.

On Ray Data datasets the options are set on the dataset's context, as Ray Train does. On
phalanx's own datasets (read by each worker itself, no cluster scheduler in between):

- ``resource_limits.object_store_memory``: the most bytes of rows a shard's background reader
  holds ahead of the training loop (it caps ``prefetch_batches``);
- ``preserve_order``: always true locally (rows come in file / row-group order, or the seeded
  order of ``randomize_block_order``), so both values are honoured;
- ``resource_limits.cpu/gpu/memory``, ``exclude_resources``, ``actor_locality_enabled``,
  ``label_selector``, ``verbose_progress``: cluster scheduling and progress bars of Ray Data;
  accepted, no effect locally.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field, fields, replace
from typing import Any

__all__ = ["ExecutionOptions", "ExecutionResources", "default_ingest_options", "prefetch_bytes"]


@dataclass
class ExecutionResources:
    """Ray Data's ``ExecutionResources`` (None: no limit).

    Example::

        limits = ExecutionResources(cpu=4, gpu=0)
        fewer = limits.copy(cpu=2)
    """

    cpu: float | None = None
    gpu: float | None = None
    object_store_memory: float | None = None
    memory: float | None = None

    def copy(self, **changes: Any) -> ExecutionResources:
        """A copy with ``changes`` (Ray's ``ExecutionResources.copy``)."""
        return replace(self, **changes)


@dataclass
class ExecutionOptions:
    """Ray Data's ``ExecutionOptions`` (Ray 2.60's fields), for code that builds one without
    Ray Data in use.

    Example::

        options = ExecutionOptions(resource_limits=ExecutionResources(cpu=4))
        config = DataConfig(execution_options=options)
        trainer = TorchTrainer(train_func, dataset_config=config, ...)
    """

    resource_limits: ExecutionResources = field(default_factory=ExecutionResources)
    exclude_resources: ExecutionResources = field(default_factory=ExecutionResources)
    preserve_order: bool = False
    actor_locality_enabled: bool = True
    verbose_progress: bool | None = None
    label_selector: dict[str, str] | None = None


def default_ingest_options() -> Any:
    """Ray's ``DataConfig.default_ingest_options()``: the driver's Ray Data execution options
    (limits, exclusions, order, progress) when Ray Data is in use, else phalanx's defaults."""
    ray_data = sys.modules.get("ray.data")
    if ray_data is None:
        return ExecutionOptions()
    current = ray_data.DataContext.get_current().execution_options
    return ray_data.ExecutionOptions(
        resource_limits=copy.copy(current.resource_limits),
        exclude_resources=copy.copy(current.exclude_resources),
        preserve_order=current.preserve_order,
        verbose_progress=current.verbose_progress,
    )


def options_for(config: Any, name: str) -> Any:
    """The execution options ``config`` gives dataset ``name`` (None: none given)."""
    options = config.execution_options
    if isinstance(options, dict):
        return options.get(name)
    return options


def prefetch_bytes(options: object) -> int | None:
    """The byte cap on a local shard's read-ahead from ``options`` (None: no cap)."""
    limit = getattr(getattr(options, "resource_limits", None), "object_store_memory", None)
    if not isinstance(limit, int | float) or not math.isfinite(limit) or limit <= 0:
        return None  # none set, or Ray's "no limit" (inf)
    return int(limit)


def as_ray_options(options: object) -> Any:
    """``options`` (None: Ray's defaults for ingest) as a new ``ray.data.ExecutionOptions``;
    phalanx's own copy is converted field by field."""
    import ray.data

    if options is None:
        options = default_ingest_options()
    if isinstance(options, ray.data.ExecutionOptions):
        return copy.deepcopy(options)
    values = {f.name: getattr(options, f.name) for f in fields(ExecutionOptions)}
    for name in ("resource_limits", "exclude_resources"):
        limits = values[name]
        values[name] = ray.data.ExecutionResources(
            cpu=limits.cpu,
            gpu=limits.gpu,
            object_store_memory=limits.object_store_memory,
            memory=limits.memory,
        )
    return ray.data.ExecutionOptions(**values)
