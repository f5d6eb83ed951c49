"""A run's live Prometheus endpoint, served by the driver while ``fit()`` runs.

``PHALANX_METRICS_PORT=9464`` (and ``PHALANX_METRICS_HOST``, 127.0.0.1 unless set: the metrics
name the run and its storage, so they are not offered to the network unasked) serves
``http://127.0.0.1:9464/metrics``. Nothing is counted for it: a scrape reads the controller's
:class:`~phalanx._internal.controller.goodput.GoodputClock` at that moment, so an endpoint nobody
scrapes costs nothing. ``docs/grafana/phalanx.json`` plots every series.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from phalanx._foundation import env
from phalanx._foundation.goodput_parts import PARTS
from phalanx._foundation.optional import require
from phalanx._internal.controller.goodput import GoodputClock

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

    from phalanx._internal.controller.stragglers import StragglerWatch

__all__ = ["EXPORTED", "MetricsEndpoint", "start_endpoint"]

logger = logging.getLogger(__name__)

# Every series a scrape shows (the names Grafana's queries use), with its type.
EXPORTED = {
    "phalanx_train_rounds_total": "counter",
    "phalanx_train_reports_total": "counter",
    "phalanx_train_checkpoint_commits_total": "counter",
    "phalanx_train_checkpoint_commit_seconds_sum": "summary",
    "phalanx_train_checkpoint_commit_seconds_count": "summary",
    "phalanx_train_checkpoint_bytes_written_total": "counter",
    "phalanx_train_step_seconds": "gauge",
    "phalanx_train_last_to_report_total": "counter",
    "phalanx_train_step_part_seconds": "gauge",
    "phalanx_train_straggler_excess_seconds": "gauge",
    "phalanx_train_attempts_total": "counter",
    "phalanx_train_failures_total": "counter",
    "phalanx_train_goodput_seconds": "gauge",
    "phalanx_train_goodput_ratio": "gauge",
    "phalanx_train_wall_seconds": "gauge",
}


class _RunCollector:
    """Reads the clock on each scrape (in the HTTP server's thread; the controller's thread
    writes: a reading may straddle one update, as a scrape always may)."""

    def __init__(
        self, run_name: str, clock: GoodputClock, stragglers: StragglerWatch | None = None
    ) -> None:
        self.run_name = run_name
        self.clock = clock
        self.stragglers = stragglers  # the ranks flagged now

    def collect(self) -> Iterator[Metric]:
        core = require("prometheus_client.core", "PHALANX_METRICS_PORT")
        yield from self._progress(core, [self.run_name])
        yield from self._anatomy(core, [self.run_name])
        yield from self._goodput(core, [self.run_name])

    def _progress(self, core: ModuleType, run: list[str]) -> Iterator[Metric]:
        """Rounds, reports, commits, attempts, failures, per-rank step times and stragglers."""
        counts = self.clock.counts

        def counter(name: str, doc: str, value: float) -> Metric:
            family = core.CounterMetricFamily(name, doc, labels=["run"])
            family.add_metric(run, value)
            return family

        yield counter(
            "phalanx_train_rounds", "Rounds committed (every rank reported).", counts.rounds
        )
        yield counter("phalanx_train_reports", "report() calls of every rank.", counts.reports)
        yield counter("phalanx_train_checkpoint_commits", "Checkpoints committed.", counts.commits)
        yield counter(
            "phalanx_train_checkpoint_bytes_written",
            "Bytes of the checkpoints committed (every rank's files).",
            counts.bytes_written,
        )
        yield counter("phalanx_train_attempts", "Attempts started.", len(self.clock.attempts))
        yield counter("phalanx_train_failures", "Attempts that failed.", self.clock.failures)
        latency = core.SummaryMetricFamily(
            "phalanx_train_checkpoint_commit_seconds",
            "Time the driver took to commit a checkpoint.",
            labels=["run"],
        )
        latency.add_metric(run, count_value=counts.commits, sum_value=counts.commit_s)
        yield latency
        yield _per_rank(
            core.GaugeMetricFamily,
            "phalanx_train_step_seconds",
            "Seconds between a rank's last two reports.",
            run,
            counts.step_s,
        )
        yield _per_rank(
            core.CounterMetricFamily,
            "phalanx_train_last_to_report",
            "Rounds in which this rank reported last (a straggler).",
            run,
            counts.last_to_report,
        )

    def _anatomy(self, core: ModuleType, run: list[str]) -> Iterator[Metric]:
        """Each rank's last step by part, and the stragglers flagged now with their cause."""
        parts = core.GaugeMetricFamily(
            "phalanx_train_step_part_seconds",
            "A rank's last eligible round, seconds per step by part (data, compute, checkpoint, "
            "collective: waiting for the other ranks).",
            labels=["run", "rank", "part"],
        )
        for rank, by_part in sorted(self.clock.counts.step_parts.copy().items()):
            for part, seconds in by_part.items():
                parts.add_metric([*run, str(rank), part], seconds)
        yield parts
        flagged = core.GaugeMetricFamily(
            "phalanx_train_straggler_excess_seconds",
            "While a rank is flagged as a straggler: the seconds per step (or per round) its "
            "cause part takes more than the other ranks'.",
            labels=["run", "rank", "host", "cause"],
        )
        straggling = self.stragglers.straggling() if self.stragglers is not None else {}
        for rank, period in sorted(dict(straggling).items()):
            labels = [*run, str(rank), str(period.get("host")), str(period.get("cause"))]
            flagged.add_metric(labels, float(period.get("excess_s") or 0.0))
        yield flagged

    def _goodput(self, core: ModuleType, run: list[str]) -> Iterator[Metric]:
        goodput = self.clock.snapshot()
        parts = core.GaugeMetricFamily(
            "phalanx_train_goodput_seconds",
            "Wall time so far by where it went (productive, startup, checkpoints, data, "
            "stragglers, failures, other); the parts add up to the wall time.",
            labels=["run", "part"],
        )
        for part in PARTS:
            parts.add_metric([*run, part], goodput.seconds[part])
        yield parts
        ratio = core.GaugeMetricFamily(
            "phalanx_train_goodput_ratio", "Productive share of the wall time.", labels=["run"]
        )
        ratio.add_metric(run, goodput.goodput)
        yield ratio
        wall = core.GaugeMetricFamily(
            "phalanx_train_wall_seconds", "Seconds since fit() started.", labels=["run"]
        )
        wall.add_metric(run, goodput.wall_s)
        yield wall


def _per_rank(
    family_cls: Callable[..., GaugeMetricFamily | CounterMetricFamily],
    name: str,
    doc: str,
    run: list[str],
    values: dict[int, float] | dict[int, int],
) -> Metric:
    family = family_cls(name, doc, labels=["run", "rank"])
    for rank, value in sorted(values.copy().items()):  # copy(): atomic, the driver adds ranks
        family.add_metric([*run, str(rank)], value)
    return family


class MetricsEndpoint:
    """The HTTP server of one run's metrics; ``close()`` stops it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_endpoint(
    run_name: str,
    clock: GoodputClock,
    stragglers: StragglerWatch | None = None,
    address: Callable[[], tuple[str, int] | None] = env.metrics_address,
) -> MetricsEndpoint | None:
    """Serve the run's metrics where ``PHALANX_METRICS_PORT`` says; None when it is unset or
    the port cannot be bound (a WARNING: the run matters more than its metrics)."""
    where = address()
    if where is None:
        return None
    client = require("prometheus_client", "PHALANX_METRICS_PORT")
    host, port = where
    registry = client.CollectorRegistry(auto_describe=False)
    registry.register(_RunCollector(run_name, clock, stragglers))
    try:
        server, thread = client.start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        logger.warning(
            "Could not serve run %r's Prometheus metrics on %s:%d (%s): the run goes on "
            "without them.\nHINT: set PHALANX_METRICS_PORT to a free port.",
            run_name,
            host,
            port,
            exc,
        )
        return None
    endpoint = MetricsEndpoint(server, thread)
    logger.info("Run %r: Prometheus metrics at http://%s:%d/metrics", run_name, host, endpoint.port)
    return endpoint
