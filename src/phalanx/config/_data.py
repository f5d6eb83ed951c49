"""DataConfig: how the datasets are split and streamed to the workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from phalanx._foundation.keywords import KeywordChecked
from phalanx.config._checks import _fail


@dataclass(frozen=True)
class DataConfig(KeywordChecked):
    """Which datasets are split across ranks (``"all"`` or a list of names); others go whole.

    ``execution_options``: Ray Data ``ExecutionOptions`` (one for all datasets, or a dict by
    name), set on Ray Data datasets as Ray Train does; on phalanx's own datasets
    ``resource_limits.object_store_memory`` caps each shard's read-ahead in bytes (see
    ``phalanx.data.ExecutionOptions``). ``enable_shard_locality``: Ray Data's locality hints (on Ray).
    ``equal_split`` (default True, as Ray's ``streaming_split(equal=True)``): every rank gets
    the same number of rows, so DDP ranks run the same number of steps; the ``rows % world_size``
    left over are left out. False keeps every row (ranks may differ by one): for inference.
    ``resume_position`` (default True; or a dict of dataset name -> bool, others True): when an
    attempt starts from a checkpoint (a retry, a rerun, ``resume_from_checkpoint``, a resize),
    each split phalanx dataset continues its epoch where the checkpoint was taken: the rows of
    the epoch no rank had consumed are split over the new world size, and the following passes
    are the next epochs. False: every attempt starts a fresh epoch 0, as in Ray.

    Example::

        options = DataConfig.default_ingest_options()
        options.resource_limits = options.resource_limits.copy(object_store_memory=256 << 20)
        DataConfig(datasets_to_split=["train"], execution_options=options)
    """

    datasets_to_split: Literal["all"] | list[str] = "all"
    execution_options: Any = None
    enable_shard_locality: bool = True
    equal_split: bool = True
    resume_position: bool | dict[str, bool] = True

    def __post_init__(self) -> None:
        split = self.datasets_to_split
        if split != "all" and not (
            isinstance(split, list | tuple) and all(isinstance(s, str) for s in split)
        ):
            raise _fail("DataConfig", "datasets_to_split", split, "'all' or a list of names")
        options = self.execution_options
        values = options.values() if isinstance(options, dict) else [options]
        if options is not None and not all(hasattr(o, "resource_limits") for o in values):
            raise _fail(
                "DataConfig",
                "execution_options",
                options,
                "an ExecutionOptions, a dict of dataset name -> ExecutionOptions, or None",
                "start from DataConfig.default_ingest_options().",
            )
        for name in ("enable_shard_locality", "equal_split"):
            if not isinstance(getattr(self, name), bool):
                raise _fail("DataConfig", name, getattr(self, name), "True or False")
        resume = self.resume_position
        if not isinstance(resume, bool) and not (
            isinstance(resume, dict)
            and all(isinstance(k, str) and isinstance(v, bool) for k, v in resume.items())
        ):
            raise _fail(
                "DataConfig",
                "resume_position",
                resume,
                "True, False or a dict of dataset name -> True/False",
            )

    def resumes(self, name: str) -> bool:
        """Whether dataset ``name`` continues its epoch from a checkpoint (``resume_position``)."""
        resume = self.resume_position
        return resume.get(name, True) if isinstance(resume, dict) else resume

    @staticmethod
    def default_ingest_options() -> Any:
        """Ray's default execution options for training ingest (the driver's Ray Data
        options when Ray Data is in use; otherwise ``phalanx.data.ExecutionOptions``)."""
        from phalanx._foundation.execution_options import default_ingest_options

        return default_ingest_options()
