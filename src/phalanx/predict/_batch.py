"""BatchPredictor: score a dataset on parallel worker processes, the model loaded once each.

The scoring workers are a ``DataParallelTrainer`` run: the data is cut into contiguous,
disjoint shards that keep every row (rank r gets rows ``[r*n/w, (r+1)*n/w)``), each worker reads
its own files/row groups, predicts batch by batch and writes ``part-<rank>.parquet``; reading
the parts in rank order gives the rows in input order.
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from phalanx._foundation.terminal import TERMINAL
from phalanx.callbacks import Callback
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig
from phalanx.predict._base import BatchPreprocessor, Predictor, _names, to_arrow

if TYPE_CHECKING:
    from phalanx.callbacks import TrainRunContext
    from phalanx.data import Dataset
    from phalanx.result import Result

__all__ = ["BatchPredictor", "to_arrow"]

DATASET = "data"


@dataclass(frozen=True)
class ScoringJob:
    """What every scoring worker is given (pickled to it). ``preprocessor``: whether
    ``set_preprocessor`` chose one (else the checkpoint's is used), and which."""

    checkpoint: Checkpoint | None  # None: a pandas UDF, which needs none
    predictor_cls: type[Predictor]
    predictor_kwargs: dict[str, object]
    preprocessor: tuple[bool, BatchPreprocessor | None]
    predict_kwargs: dict[str, Any]  # the user's, with feature_columns and keep_columns
    batch_size: int
    parts_dir: str


class BatchPredictor:
    """Runs ``predictor_cls.from_checkpoint(checkpoint, **predictor_kwargs)`` over a dataset on
    several worker processes (Ray AIR's ``BatchPredictor``).

    Example::

        bp = BatchPredictor.from_checkpoint(result.checkpoint, TorchPredictor, model=Net())
        out = bp.predict("data/raw/", num_workers=2, keep_columns=["id"])
        out.to_pandas()
    """

    def __init__(
        self,
        checkpoint: Checkpoint | None,
        predictor_cls: type[Predictor],
        **predictor_kwargs: object,
    ) -> None:
        if not (isinstance(predictor_cls, type) and issubclass(predictor_cls, Predictor)):
            raise TypeError(
                f"predictor_cls={predictor_cls!r} is not a Predictor subclass.\n"
                "HINT: pass the class, e.g. TorchPredictor, not an instance."
            )
        self.checkpoint = checkpoint
        self.predictor_cls = predictor_cls
        self.predictor_kwargs = predictor_kwargs
        self._preprocessor: BatchPreprocessor | None = None
        self._preprocessor_set = False

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Checkpoint, predictor_cls: type[Predictor], **kwargs: object
    ) -> BatchPredictor:
        return cls(checkpoint, predictor_cls, **kwargs)

    @classmethod
    def from_pandas_udf(cls, pandas_udf: Callable[..., pd.DataFrame]) -> BatchPredictor:
        """Score with ``pandas_udf(df, **predict_kwargs)`` on each batch (no checkpoint)."""
        from phalanx.predict._base import PandasUDFPredictor

        return cls(None, PandasUDFPredictor, pandas_udf=pandas_udf)

    def get_preprocessor(self) -> BatchPreprocessor | None:
        if self._preprocessor_set:
            return self._preprocessor
        from phalanx._foundation.checkpoint_files import load_preprocessor

        return load_preprocessor(self.checkpoint)

    def set_preprocessor(self, preprocessor: BatchPreprocessor | None) -> None:
        """Use ``preprocessor`` instead of the one saved in the checkpoint (None: none)."""
        self._preprocessor, self._preprocessor_set = preprocessor, True

    def predict(
        self,
        data: object,
        *,
        feature_columns: list[str] | None = None,
        keep_columns: list[str] | None = None,
        batch_size: int = 4096,
        min_scoring_workers: int = 1,
        max_scoring_workers: int | None = None,
        num_cpus_per_worker: float | None = None,
        num_gpus_per_worker: float | None = None,
        separate_gpu_stage: bool = True,
        ray_remote_args: dict[str, Any] | None = None,
        num_workers: int | None = None,
        output_path: str | None = None,
        progress: bool | None = None,
        **predict_kwargs: object,
    ) -> Dataset | None:
        """Predictions for ``data`` (anything ``datasets=`` accepts; files are read by the
        workers) as a :class:`phalanx.data.Dataset`, rows in input order. With
        ``output_path`` the parts are written there as Parquet and the Dataset reads them.
        ``progress``: show a progress bar (default: when stderr is a terminal).
        ``separate_gpu_stage`` is accepted for AIR code; the preprocessor runs in the scoring
        worker, next to the model. ``ray_remote_args`` may ask for ``num_cpus``,
        ``num_gpus`` and ``resources`` per worker."""
        from phalanx.data import as_dataset, read_parquet

        dataset = as_dataset(data, DATASET)
        self._check_keep_columns(dataset, keep_columns)
        workers = _worker_count(
            num_workers, min_scoring_workers, max_scoring_workers, dataset.count()
        )
        resources = _resources(num_cpus_per_worker, num_gpus_per_worker, ray_remote_args)
        scratch = tempfile.mkdtemp(prefix="phalanx_batch_predict_")
        try:
            parts_dir = output_path or os.path.join(scratch, "out")
            os.makedirs(parts_dir, exist_ok=True)
            job = ScoringJob(
                checkpoint=self.checkpoint,
                predictor_cls=self.predictor_cls,
                predictor_kwargs=self._predictor_kwargs_for(resources),
                preprocessor=(self._preprocessor_set, self._preprocessor),
                predict_kwargs=dict(
                    predict_kwargs, feature_columns=feature_columns, keep_columns=keep_columns
                ),
                batch_size=batch_size,
                parts_dir=parts_dir,
            )
            show = sys.stderr.isatty() if progress is None else progress
            callbacks: list[Callback] = [ProgressBar(dataset.count())] if show else []
            _run_workers(job, dataset, workers, scratch, resources, callbacks)
            parts = [os.path.join(parts_dir, _part(r)) for r in range(workers)]
            parts = [p for p in parts if os.path.exists(p)]
            if output_path is not None:
                return read_parquet(parts) if parts else None
            from phalanx.data import from_arrow

            tables = [pq.read_table(p) for p in parts]
            return from_arrow(pa.concat_tables(tables) if tables else pa.table({}))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _predictor_kwargs_for(self, resources: dict[str, float]) -> dict[str, object]:
        """GPUs asked for and a predictor that takes ``use_gpu``: use them, as AIR did."""
        kwargs = dict(self.predictor_kwargs)
        takes_gpu = "use_gpu" in inspect.signature(self.predictor_cls.from_checkpoint).parameters
        if resources.get("GPU") and takes_gpu and "use_gpu" not in kwargs:
            kwargs["use_gpu"] = True
        return kwargs

    def _check_keep_columns(self, dataset: Dataset, keep_columns: list[str] | None) -> None:
        """Fail before any worker starts: a kept column comes from the raw or preprocessed rows."""
        have = dataset.columns()
        missing = [c for c in keep_columns or [] if c not in have]
        preprocessor = self.get_preprocessor() if missing else None
        if preprocessor is not None and dataset.count():
            sample = preprocessor.transform_batch(dataset.take_batch(1, batch_format="pandas"))
            have = have + [str(c) for c in _names(sample) if str(c) not in have]
            missing = [c for c in missing if c not in have]
        if missing:
            raise ValueError(
                f"keep_columns names column(s) {missing} that the data lacks (it has "
                f"{have[:20]}{' ...' if len(have) > 20 else ''}).\nHINT: check the spelling; "
                "keep_columns are taken from the preprocessed rows, or else the raw input."
            )

    def __repr__(self) -> str:
        return (
            f"BatchPredictor(checkpoint={self.checkpoint!r}, "
            f"predictor_cls={self.predictor_cls.__name__})"
        )


def _resources(
    cpus: float | None, gpus: float | None, remote_args: dict[str, Any] | None
) -> dict[str, float]:
    args = dict(remote_args or {})
    unknown = sorted(set(args) - {"num_cpus", "num_gpus", "resources"})
    if unknown:
        raise ValueError(
            f"ray_remote_args has {unknown}, which BatchPredictor does not use.\nHINT: ask for "
            "resources with num_cpus, num_gpus or resources (a dict of custom resources)."
        )
    resources: dict[str, float] = dict(args.get("resources") or {})
    cpu = cpus if cpus is not None else args.get("num_cpus")
    gpu = gpus if gpus is not None else args.get("num_gpus")
    if cpu:
        resources["CPU"] = cpu
    if gpu:
        resources["GPU"] = gpu
    return resources


def _run_workers(
    job: ScoringJob,
    dataset: Dataset,
    workers: int,
    scratch: str,
    resources: dict[str, float],
    callbacks: list[Callback],
) -> None:
    from phalanx.config import RunConfig, ScalingConfig
    from phalanx.trainer import DataParallelTrainer

    scaling = ScalingConfig(
        num_workers=workers,
        use_gpu=bool(resources.get("GPU")),
        resources_per_worker=resources or None,
    )
    trainer = DataParallelTrainer(
        functools.partial(_score_shard, job),
        scaling_config=scaling,
        run_config=RunConfig(storage_path=scratch, name="scoring", verbose=0, callbacks=callbacks),
        datasets={DATASET: dataset},
        dataset_config=DataConfig(equal_split=False),  # scoring keeps every row
    )
    trainer.fit()


def _score_shard(job: ScoringJob, config: dict[str, object] | None = None) -> None:
    """Runs in each scoring worker: load the model once, predict this rank's rows in order."""
    import phalanx.session as session

    rank = session.get_context().get_world_rank()
    predictor = job.predictor_cls.from_checkpoint(
        job.checkpoint,  # type: ignore[arg-type]  # None only for PandasUDFPredictor, which takes it
        **job.predictor_kwargs,
    )
    override, preprocessor = job.preprocessor
    if override:
        predictor.set_preprocessor(preprocessor)
    shard = session.get_dataset_shard(DATASET)
    path = os.path.join(job.parts_dir, _part(rank))
    writer = None
    ticks = _ProgressTicks(shard.count())
    try:
        for batch in shard.iter_batches(
            batch_size=job.batch_size, batch_format=predictor.batch_format
        ):
            table = to_arrow(predictor.predict(batch, **job.predict_kwargs))
            if writer is None:
                writer = pq.ParquetWriter(path + ".tmp", table.schema)
            writer.write_table(table)
            ticks.advance(table.num_rows)
    finally:
        if writer is not None:
            writer.close()
    if writer is not None:
        os.replace(path + ".tmp", path)  # a part is visible only when complete
    ticks.finish()


class _ProgressTicks:
    """Reports progress exactly ``TICKS`` times per rank (every rank must report() as often as
    the others, whatever the size of its shard)."""

    TICKS = 20

    def __init__(self, total: int) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.sent = 0

    def advance(self, rows: int) -> None:
        import phalanx.session as session

        self.done += rows
        while self.sent < self.TICKS - 1 and self.done * self.TICKS >= (self.sent + 1) * self.total:
            self.sent += 1
            session.report({"rows": self.done})

    def finish(self) -> None:
        import phalanx.session as session

        while self.sent < self.TICKS:
            self.sent += 1
            session.report({"rows": self.done})


class ProgressBar(Callback):
    """A progress line under the driver's output, fed by the scoring workers' progress reports.

    Drawn by phalanx's own terminal view (the one ``fit()`` shows), so no progress-bar package
    is needed and worker output printed meanwhile goes above the line, not through it.
    """

    WIDTH = 30

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self._started = time.monotonic()
        self._attached = False

    def line(self) -> str:
        share = min(self.done / self.total, 1.0) if self.total else 1.0
        filled = int(share * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        text = f"scoring [{bar}] {self.done}/{self.total} rows"
        elapsed = time.monotonic() - self._started
        if 0 < share < 1:
            text += f", {elapsed * (1 - share) / share:.0f}s left"
        return text

    def before_run(self, run_context: TrainRunContext) -> None:
        self._started = time.monotonic()
        self._attached = TERMINAL.attach_status(self.line)

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        self.done = sum(m.get("rows", 0) for m in metrics)
        if self._attached:
            TERMINAL.refresh()

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        if self._attached:
            TERMINAL.detach_status()
            self._attached = False
            err = TERMINAL.stream("stderr")
            err.write(self.line() + "\n")  # the final state stays on screen
            err.flush()


def _part(rank: int) -> str:
    return f"part-{rank:05d}.parquet"


def _worker_count(num: int | None, lo: int, hi: int | None, rows: int) -> int:
    workers = num if num is not None else (hi or lo)
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"num_workers={workers!r} is invalid: use a positive int.")
    return max(1, min(workers, rows))  # no idle workers on tiny inputs


def _check_columns(have: list[str], keep_columns: list[str] | None) -> None:
    missing = [c for c in keep_columns or [] if c not in have]
    if missing:
        raise ValueError(
            f"keep_columns names column(s) {missing} that the data lacks (it has {have}).\n"
            "HINT: check the spelling; keep_columns are taken from the raw input."
        )
