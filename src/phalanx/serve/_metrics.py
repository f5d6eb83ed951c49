"""The server's counters and histograms (``GET /metrics``), on ``prometheus_client``.

Each app has a registry of its own, so two apps in one process (tests, a Ray Serve replica next
to a local server) never mix their counts. Updated from the server's event loop and read there
too. With several worker processes each process has its own (a scrape sees the process that
answered it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx._foundation.optional import require

if TYPE_CHECKING:
    import prometheus_client

__all__ = ["ServeMetrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
PREFIX = "phalanx_serve"


class ServeMetrics:
    """Requests by path and status code, rows, latency, batch sizes, model calls, requests in
    flight."""

    def __init__(self) -> None:
        client = require("prometheus_client", "phalanx serve's /metrics", extra="serve")
        self.registry = client.CollectorRegistry()
        self._in_flight = 0

        def histogram(
            name: str, doc: str, buckets: tuple[float, ...]
        ) -> prometheus_client.Histogram:
            return client.Histogram(
                f"{PREFIX}_{name}", doc, buckets=buckets, registry=self.registry
            )

        self._requests = client.Counter(
            f"{PREFIX}_requests",
            "HTTP requests answered, by path and status code.",
            ["path", "code"],
            registry=self.registry,
        )
        self._rows = client.Counter(f"{PREFIX}_rows", "Rows predicted.", registry=self.registry)
        self._model_calls = client.Counter(
            f"{PREFIX}_model_calls", "Model calls.", registry=self.registry
        )
        self._in_flight_gauge = client.Gauge(
            f"{PREFIX}_in_flight", "Predict requests in progress.", registry=self.registry
        )
        self.latency = histogram(
            "request_duration_seconds", "Time to answer POST /predict.", LATENCY_BUCKETS
        )
        self.batch_rows = histogram(
            "batch_rows", "Rows per model call (dynamic batching).", SIZE_BUCKETS
        )
        self.batch_requests = histogram(
            "batch_requests", "Requests per model call (dynamic batching).", SIZE_BUCKETS
        )
        self._render = client.generate_latest

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self._in_flight = value
        self._in_flight_gauge.set(value)

    def request_done(self, path: str, status: int, seconds: float | None = None) -> None:
        self._requests.labels(path, str(status)).inc()
        if seconds is not None:
            self.latency.observe(seconds)

    def batch_done(self, requests: int, rows: int) -> None:
        self._model_calls.inc()
        self._rows.inc(rows)
        self.batch_rows.observe(rows)
        self.batch_requests.observe(requests)

    def render(self) -> str:
        """The Prometheus text format."""
        return str(self._render(self.registry).decode())
