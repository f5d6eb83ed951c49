"""The trainer's datasets, per attempt: each rank's shards (``RunSpec.make_shards``), and the
ranks' data positions over those shards combined, described and shown
(``RunSpec.dataset_positions``)."""

from __future__ import annotations

import logging
from typing import Any

from phalanx.config import DataConfig

logger = logging.getLogger(__name__)


class DatasetShards:
    """``RunSpec.make_shards``: each rank's dataset shards, built anew for every attempt (dataset
    factories are called again), read through the preprocessor if there is one."""

    def __init__(self, datasets: dict[str, Any], config: DataConfig, preprocessor: Any) -> None:
        self.datasets = datasets
        self.config = config
        self.preprocessor = preprocessor
        self._attempt_shards: list[dict[str, Any]] = []
        self._peer: tuple[int, list[dict[str, object]]] | None = None  # make_shards(peer=round)
        self._told_not_resumed: set[str] = set()

    def __call__(
        self,
        world_size: int,
        resume: dict[str, dict[str, Any]] | None = None,
        peer: int | None = None,
    ) -> list[dict[str, Any]]:
        """``resume``: the stored position of each dataset (by name) when the attempt starts
        from a checkpoint; None for a fresh start. ``peer``: these shards continue after
        round ``peer`` (the ranks may recover there from the survivors' state); the attempt's
        positions count on them only if its first report follows that round
        (``first_report``)."""
        if not self.datasets:
            return [{} for _ in range(world_size)]
        from phalanx.data._ingest import shard_datasets

        if resume is None:
            shards = shard_datasets(self.datasets, self.config, world_size)
        else:
            shards = shard_datasets(self.datasets, self.config, world_size, resume=resume)
            self._tell_not_resumed(shards[0])
        # Ray Data's split coordinator (an actor owned here) lives while this process holds
        # the iterators: the workers' pickled copies do not count. Keep them for the attempt.
        # They are also the shards whose rows the ranks' positions count (``combine``).
        if peer is None:
            self._attempt_shards, self._peer = shards, None
        else:
            self._peer = (peer, shards)
        if self.preprocessor is None:
            return shards
        from phalanx.preprocess._attach import preprocess_shards

        return preprocess_shards(shards, self.preprocessor)

    def _tell_not_resumed(self, shards: dict[str, Any]) -> None:
        """Once per dataset: one that keeps no position (a ray.data.Dataset) starts its epoch
        over at a resume."""
        for name, shard in shards.items():
            if callable(getattr(shard, "position_state", None)) or name in self._told_not_resumed:
                continue
            self._told_not_resumed.add(name)
            logger.warning(
                "Resuming from a checkpoint: dataset %r (a ray.data.Dataset) starts its epoch "
                "over; its position in the epoch is not restored, as Ray Data's streaming_split "
                "cannot restart mid-epoch.\nHINT: pass the data as a phalanx dataset (a table, "
                "files, phalanx.data) to continue the epoch where the checkpoint was taken.",
                name,
            )

    # -- data positions (RunSpec.dataset_positions), for the shards of the current attempt ----

    def combine(self, name: str, states: list[Any]) -> dict[str, Any]:
        from phalanx.data._position import combine

        shards = [rank[name] for rank in self._attempt_shards]
        return combine(shards, states)

    def first_report(self, index: int) -> None:
        if self._peer is not None and index == self._peer[0] + 1:
            self._attempt_shards = self._peer[1]  # the ranks recovered to the failed step

    def describe(self, name: str, record: dict[str, Any]) -> str:
        from phalanx.data._position import describe

        if not self.config.resumes(name):
            return f"dataset {name!r} starts its epoch over (DataConfig(resume_position=...))"
        return f"dataset {name!r} at {describe(record)}"

    def progress(self, name: str, record: dict[str, Any]) -> str:
        from phalanx.data._position import progress

        return f"{name} {progress(record)}"
