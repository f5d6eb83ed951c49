"""Dynamic batching: requests that arrive together share one model call.

Requests queue on the event loop; the batching task takes the first one, then whatever arrives in
the next ``batch_wait_ms`` until ``max_batch_size`` rows, and runs the model once per group of
requests with the same columns (and dtypes) on one model thread, so the loop keeps accepting
requests (and filling the next batch) while the model runs. A group that fails is retried one
request at a time: a bad request gets its own error and never fails its neighbours.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from phalanx.serve._metrics import ServeMetrics
from phalanx.serve._model import ServedModel

__all__ = ["Batcher", "PredictionError"]

logger = logging.getLogger(__name__)

Prediction = dict[str, np.ndarray]  # output column -> one value per row


class PredictionError(Exception):
    """The model failed on one request's rows (the request alone, so the input is to blame)."""


Outcome = Prediction | PredictionError  # what one request gets back from a model call


@dataclass
class _Pending:
    frame: pd.DataFrame
    future: asyncio.Future[Prediction]


class Batcher:
    """``await batcher.predict(frame)``: predictions for ``frame``, batched with other requests."""

    def __init__(
        self, model: ServedModel, max_rows: int, wait_ms: float, metrics: ServeMetrics
    ) -> None:
        self.model = model
        self.max_rows = max_rows
        self.wait_s = wait_ms / 1000
        self.metrics = metrics
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task[None] | None = None
        self._carry: _Pending | None = None
        # One model thread: the model's own kernels use the cores; the loop stays free meanwhile.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="phalanx-serve-model")

    async def predict(self, frame: pd.DataFrame) -> Prediction:
        if self._task is None:  # started on first use, in the loop that serves (Ray: replica's)
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._loop())
        assert self._queue is not None
        future: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(frame, future))
        return await future

    async def close(self) -> None:
        """Stop batching (after the server has answered its requests in flight)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            groups: dict[tuple[tuple[str, str], ...], list[_Pending]] = {}
            for item in batch:
                groups.setdefault(_signature(item.frame), []).append(item)
            for items in groups.values():
                frames = [item.frame for item in items]
                outcomes, calls = await loop.run_in_executor(self._executor, self._call, frames)
                for requests, rows in calls:
                    self.metrics.batch_done(requests, rows)
                for item, outcome in zip(items, outcomes, strict=True):
                    if item.future.done():  # the client went away
                        continue
                    if isinstance(outcome, BaseException):
                        item.future.set_exception(outcome)
                    else:
                        item.future.set_result(outcome)

    async def _collect(self) -> list[_Pending]:
        assert self._queue is not None
        first = self._carry or await self._queue.get()
        self._carry = None
        batch, rows = [first], len(first.frame)
        deadline = asyncio.get_running_loop().time() + self.wait_s
        while rows < self.max_rows:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                if self._queue.empty():
                    item = await asyncio.wait_for(self._queue.get(), max(remaining, 0))
                else:
                    item = self._queue.get_nowait()
            except TimeoutError:
                break
            if rows + len(item.frame) > self.max_rows:
                self._carry = item  # first in the next batch
                break
            batch.append(item)
            rows += len(item.frame)
        return batch

    def _call(self, frames: list[pd.DataFrame]) -> tuple[Sequence[Outcome], list[tuple[int, int]]]:
        """On the model thread: one call for all; on failure, one call per request."""
        try:
            return self.model.predict_many(frames), [(len(frames), sum(map(len, frames)))]
        except Exception as exc:
            if len(frames) == 1:
                logger.debug("Prediction failed", exc_info=True)
                return [PredictionError(f"{type(exc).__name__}: {exc}")], [(1, len(frames[0]))]
            logger.debug("A batch of %d requests failed; retrying each alone", len(frames))
        outcomes: list[Outcome] = []
        calls: list[tuple[int, int]] = []
        for frame in frames:
            result, call = self._call([frame])
            outcomes += result
            calls += call
        return outcomes, calls


def _signature(frame: pd.DataFrame) -> tuple[tuple[str, str], ...]:
    """Requests concatenate into one frame only when their columns and dtypes agree."""
    return tuple((str(name), str(dtype)) for name, dtype in frame.dtypes.items())
