"""What the XGBoost and LightGBM report callbacks share: which metrics to report under which
names, when to save a checkpoint, and how one boosting round is reported from every rank."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, SupportsFloat, TypeVar, cast

if TYPE_CHECKING:
    from phalanx._gbdt.library import Reporter
    from phalanx._gbdt.spec import GBDTSpec

from phalanx.errors import ConfigError

__all__ = [
    "ReportSettings",
    "ReportingCore",
    "find_or_add_reporter",
    "flatten_metrics",
    "send_report",
]

MetricsArg = str | list[str] | dict[str, str] | None
# One round's reported values, by ``<dataset>-<metric>`` (and ``best_*``) name.
Metrics = dict[str, object]
# Writes the model to the given file (``booster.save_model``); its return value is unused.
SaveModel = Callable[[str], object]
ModelT = TypeVar("ModelT")


class ReportSettings:
    """The arguments of ``ReportCallback`` (Ray's ``RayTrainReportCallback``), checked.

    ``metrics``: None (every metric), a name, a list of names, or ``{report_key: metric}``;
    names are ``<dataset>-<metric>`` (``"valid-logloss"``). ``frequency``: save a checkpoint every
    that many boosting rounds (0: never during training). ``checkpoint_at_end``: save one when
    training ends (unless the last round just saved one). ``results_postprocessing_fn``: applied
    to the metrics dict before it is reported.
    """

    def __init__(
        self,
        owner: str,
        metrics: MetricsArg,
        filename: str,
        frequency: int,
        checkpoint_at_end: bool,
        results_postprocessing_fn: Callable[[Metrics], Metrics] | None,
    ) -> None:
        if isinstance(metrics, str):
            metrics = [metrics]
        if metrics is not None and not _valid_metrics(metrics):
            raise ConfigError(
                f"{owner}(metrics={metrics!r}) is invalid: it must be None, a metric name, a list "
                "of names or a dict {report_key: metric_name}.\nHINT: names look like "
                "'valid-logloss' (<dataset>-<metric>)."
            )
        if not isinstance(filename, str) or not filename:
            raise ConfigError(f"{owner}(filename={filename!r}) is invalid: use a file name.")
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
            raise ConfigError(
                f"{owner}(frequency={frequency!r}) is invalid: it must be an integer >= 0 "
                "(0: no checkpoints during training)."
            )
        if results_postprocessing_fn is not None and not callable(results_postprocessing_fn):
            raise ConfigError(
                f"{owner}(results_postprocessing_fn={results_postprocessing_fn!r}) is invalid: "
                "it must be a function taking and returning a dict."
            )
        self.owner = owner
        self.metrics = metrics
        self.filename = filename
        self.frequency = frequency
        self.checkpoint_at_end = bool(checkpoint_at_end)
        self.postprocess = results_postprocessing_fn

    def checkpoint_due(self, iteration: int) -> bool:
        """Whether boosting round ``iteration`` (0-based, counted over resumes) saves one."""
        return self.frequency > 0 and (iteration + 1) % self.frequency == 0

    def select(self, flat: Metrics) -> Metrics:
        """The metrics to report, from every ``<dataset>-<metric>`` value of this round."""
        if self.metrics is None:
            chosen = dict(flat)
        else:
            pairs = self.metrics.items() if isinstance(self.metrics, dict) else _same(self.metrics)
            missing = [metric for _, metric in pairs if metric not in flat]
            if missing:
                raise ConfigError(
                    f"{self.owner}(metrics={self.metrics!r}) names {missing}, which this "
                    f"training does not compute; it computes {sorted(flat)}.\nHINT: names are "
                    "<dataset name>-<metric name>: check the names in evals/valid_sets and the "
                    "eval metrics in params."
                )
            chosen = {key: flat[metric] for key, metric in pairs}
        return self.postprocess(chosen) if self.postprocess else chosen


def flatten_metrics(evals: Mapping[str, Mapping[str, object]]) -> Metrics:
    """``{"valid": {"auc": v}}`` -> ``{"valid-auc": v}``; the last value of history lists, and
    ``-mean``/``-std`` for the (mean, std) pairs of cross-validation."""
    flat: Metrics = {}
    for data_name, metrics in evals.items():
        for metric, value in metrics.items():
            if isinstance(value, list):
                value = value[-1] if value else None
            key = f"{data_name}-{metric}"
            if isinstance(value, tuple) and len(value) == 2:
                flat[f"{key}-mean"], flat[f"{key}-std"] = float(value[0]), float(value[1])
            elif value is not None:
                flat[key] = float(cast("SupportsFloat", value))  # a metric: a number

    return flat


def send_report(
    metrics: Metrics,
    save_model: SaveModel | None,
    filename: str,
    framework: str,
) -> None:
    """Report this round from this rank. With ``save_model``, rank 0 writes the model into a
    fresh directory (``save_model(path)``) and reports it as the checkpoint, whose metadata
    names the ``framework`` (for predictors); the other ranks report the same round without
    one (their models are identical)."""
    import phalanx.session as session
    from phalanx.checkpoint import Checkpoint

    if save_model is None or session.get_context().get_world_rank() != 0:
        session.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="phalanx-gbdt-") as directory:
        save_model(f"{directory}/{filename}")
        checkpoint = Checkpoint.from_directory(directory)
        checkpoint.set_metadata({"framework": framework})
        # phalanx's own directory: its files may move (a rename) instead of being copied
        session.report(metrics, checkpoint=checkpoint, delete_local_checkpoint_after_upload=True)


def _valid_metrics(metrics: object) -> bool:
    if isinstance(metrics, dict):
        return all(isinstance(k, str) and isinstance(v, str) for k, v in metrics.items())
    return isinstance(metrics, list | tuple) and all(isinstance(m, str) for m in metrics)


def _same(names: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    return [(name, name) for name in names]


def find_or_add_reporter(
    callbacks: list[object], reporter_cls: type[Reporter[ModelT]], spec: GBDTSpec
) -> Reporter[ModelT]:
    """The user's report callback among ``callbacks``, or a new one (appended) that reports every
    round and checkpoints as ``spec`` (the built-in loop's settings) says. Either way it learns
    the run's total rounds, so the last round's report carries the final checkpoint."""
    reporter = next((c for c in callbacks if isinstance(c, reporter_cls)), None)
    if reporter is None:
        reporter = reporter_cls(
            frequency=spec.checkpoint_frequency, checkpoint_at_end=spec.checkpoint_at_end
        )
        callbacks.append(reporter)
    core: ReportingCore = reporter._core
    core.total_rounds = spec.num_boost_round
    return reporter


class ReportingCore:
    """The state and rules of one report callback, whichever library calls it: what each round
    reports, which rounds save the model, and the final report after training.

    ``total_rounds``: the rounds the run will have in all, when known (the built-in loop sets
    it); then the last round's report carries the final checkpoint.
    """

    def __init__(self, settings: ReportSettings, framework: str) -> None:
        self.settings = settings
        self.framework = framework
        self.total_rounds: int | None = None
        self.reset()

    def reset(self) -> None:
        """Forget the previous training (the callback is used again)."""
        self.last_metrics: Metrics = {}
        self.last_saved_rounds: int | None = None
        self.finished = False

    def round_done(
        self,
        evals: Mapping[str, Mapping[str, object]],
        rounds: int,
        save_model: SaveModel,
        last: bool | None = None,
    ) -> None:
        """Report the round that brought the model to ``rounds`` rounds (counted over resumes);
        ``last``: whether training ends with it (None: compare with ``total_rounds``)."""
        settings = self.settings
        self.last_metrics = settings.select(flatten_metrics(evals))
        if last is None:
            last = rounds == self.total_rounds
        if settings.checkpoint_due(rounds - 1) or (last and settings.checkpoint_at_end):
            self.last_saved_rounds = rounds
            self._send(self.last_metrics, save_model)
        else:
            self._send(self.last_metrics, None)

    def training_done(self, rounds: int, best: Metrics, save_model: SaveModel) -> None:
        """After training (once): save the final checkpoint if the last round did not (early
        stopping, no rounds), or report ``best`` (``best_iteration``, ``best_score``)."""
        if self.finished:
            return
        self.finished = True
        metrics = {**self.last_metrics, **best}
        just_saved = self.last_saved_rounds == rounds
        if self.settings.checkpoint_at_end and not just_saved:
            self._send(metrics, save_model)
        elif metrics != self.last_metrics:  # early stopping: say which round was best
            self._send(metrics, None)

    def _send(self, metrics: Metrics, save_model: SaveModel | None) -> None:
        send_report(metrics, save_model, self.settings.filename, self.framework)
