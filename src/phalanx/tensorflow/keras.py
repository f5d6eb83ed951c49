"""ReportCheckpointCallback: report Keras logs and the model from ``model.fit`` (Ray's
``ray.train.tensorflow.keras``). Importing this module imports TensorFlow."""

from __future__ import annotations

import shutil
from typing import SupportsFloat, cast

import tensorflow as tf

import phalanx.session as session
from phalanx.errors import KeyNotFoundError
from phalanx.tensorflow._checkpoint import TensorflowCheckpoint

__all__ = ["ReportCheckpointCallback"]

# A Keras callback's logs: metric name -> value (numbers, numpy or tensor scalars).
Logs = dict[str, object]

EVENTS = (
    "epoch_begin",
    "epoch_end",
    "train_batch_begin",
    "train_batch_end",
    "test_batch_begin",
    "test_batch_end",
    "predict_batch_begin",
    "predict_batch_end",
    "train_begin",
    "train_end",
    "test_begin",
    "test_end",
    "predict_begin",
    "predict_end",
)


class ReportCheckpointCallback(tf.keras.callbacks.Callback):
    """Reports Keras' logs with ``phalanx.report`` and saves the model as a
    :class:`TensorflowCheckpoint`.

    ``checkpoint_on`` / ``report_metrics_on``: Keras events (the hook names without ``on_``,
    e.g. ``"epoch_end"``, ``"train_batch_end"``), default ``"epoch_end"``. A checkpoint is
    always reported with the metrics of its event. ``metrics``: which logs to report: None (all),
    a name, a list of names, or a dict ``{reported name: Keras log name}``.

    Every rank saves the model (a collective-safe save under ``MultiWorkerMirroredStrategy``);
    rank 0 reports its copy as the checkpoint (the replicas are identical) and the other ranks
    report the same metrics without one.

    Example::

        model.fit(dataset, epochs=5, callbacks=[ReportCheckpointCallback(metrics=["loss"])])
    """

    def __init__(
        self,
        checkpoint_on: str | list[str] = "epoch_end",
        report_metrics_on: str | list[str] = "epoch_end",
        metrics: str | list[str] | dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self._checkpoint_on = _events(checkpoint_on, "checkpoint_on")
        self._report_metrics_on = _events(report_metrics_on, "report_metrics_on")
        if not (metrics is None or isinstance(metrics, str | list | dict)):
            raise ValueError(
                f"ReportCheckpointCallback(metrics={metrics!r}) is invalid: metrics must be None, "
                "a Keras log name, a list of names or a dict {reported name: log name}."
            )
        self._metrics = metrics

    # Keras converts every batch's logs to numpy (a device sync) for a callback with batch hooks:
    # say that this one has them only where a batch event was asked for.
    def _implements_train_batch_hooks(self) -> bool:
        return self._wants("train_batch_")

    def _implements_test_batch_hooks(self) -> bool:
        return self._wants("test_batch_")

    def _implements_predict_batch_hooks(self) -> bool:
        return self._wants("predict_batch_")

    def _wants(self, prefix: str) -> bool:
        return any(e.startswith(prefix) for e in (*self._checkpoint_on, *self._report_metrics_on))

    def _handle(self, logs: Logs | None, when: str) -> None:
        checkpoint_now = when in self._checkpoint_on
        if not checkpoint_now and when not in self._report_metrics_on:
            return
        metrics = self._select(logs or {}, when)
        if not checkpoint_now:
            session.report(metrics)
            return
        checkpoint = TensorflowCheckpoint.from_model(self.model)
        if session.get_context().get_world_rank() == 0:
            # phalanx's own temporary directory: its files may move instead of being copied
            session.report(
                metrics, checkpoint=checkpoint, delete_local_checkpoint_after_upload=True
            )
        else:
            shutil.rmtree(checkpoint.path, ignore_errors=True)
            session.report(metrics)

    def _select(self, logs: Logs, when: str) -> dict[str, object]:
        wanted = self._metrics
        if wanted is None:
            names = {key: key for key in logs}
        elif isinstance(wanted, str):
            names = {wanted: wanted}
        elif isinstance(wanted, list):
            names = {key: key for key in wanted}
        else:
            names = dict(wanted)
        missing = sorted(set(names.values()) - set(logs))
        if missing:
            raise KeyNotFoundError(
                f"ReportCheckpointCallback: Keras logs at {when!r} have no {missing} (they have "
                f"{sorted(logs)}).\nHINT: name logs Keras reports at that event (compile the "
                "metric, or add 'val_' only when fit() gets validation_data)."
            )
        return {key: _plain(logs[name]) for key, name in names.items()}

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        self._handle(logs, "epoch_begin")

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        self._handle(logs, "epoch_end")

    def on_train_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        self._handle(logs, "train_batch_begin")

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        self._handle(logs, "train_batch_end")

    def on_test_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        self._handle(logs, "test_batch_begin")

    def on_test_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        self._handle(logs, "test_batch_end")

    def on_predict_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        self._handle(logs, "predict_batch_begin")

    def on_predict_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        self._handle(logs, "predict_batch_end")

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self._handle(logs, "train_begin")

    def on_train_end(self, logs: Logs | None = None) -> None:
        self._handle(logs, "train_end")

    def on_test_begin(self, logs: Logs | None = None) -> None:
        self._handle(logs, "test_begin")

    def on_test_end(self, logs: Logs | None = None) -> None:
        self._handle(logs, "test_end")

    def on_predict_begin(self, logs: Logs | None = None) -> None:
        self._handle(logs, "predict_begin")

    def on_predict_end(self, logs: Logs | None = None) -> None:
        self._handle(logs, "predict_end")


def _events(value: str | list[str], arg: str) -> list[str]:
    events = [value] if isinstance(value, str) else list(value)
    unknown = [e for e in events if e not in EVENTS]
    if unknown:
        raise ValueError(
            f"ReportCheckpointCallback({arg}={value!r}) is invalid: {unknown} are not Keras "
            f"events.\nHINT: use one of {list(EVENTS)} (a hook's name without 'on_')."
        )
    return events


def _plain(value: object) -> object:
    """A Keras log value as a Python number where it is one (numpy / tensor scalars)."""
    try:
        return float(cast("SupportsFloat", value))  # what float() takes, it converts
    except (TypeError, ValueError):
        return value
