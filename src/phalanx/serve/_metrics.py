"""The server's counters and histograms, written in the Prometheus text format (``/metrics``).

Hand-written rather than ``prometheus_client``: a dozen series, no dependency. Updated from the
server's event loop and read there too, so they need no lock. With several worker processes each
process has its own (a scrape sees the process that answered it).
"""

from __future__ import annotations

import bisect
from collections import Counter

__all__ = ["Histogram", "ServeMetrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
PREFIX = "phalanx_serve"


class Histogram:
    """A cumulative Prometheus histogram."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one: +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self) -> list[str]:
        name = f"{PREFIX}_{self.name}"
        out = [f"# HELP {name} {self.help}", f"# TYPE {name} histogram"]
        total = 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += count
            label = "+Inf" if bound == float("inf") else _number(bound)
            out.append(f'{name}_bucket{{le="{label}"}} {total}')
        out += [f"{name}_sum {_number(self.sum)}", f"{name}_count {self.count}"]
        return out


class ServeMetrics:
    """Requests by status code, rows, latency, batch sizes, model calls, requests in flight."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (path, status) -> count
        self.rows = 0
        self.model_calls = 0
        self.in_flight = 0
        self.latency = Histogram(
            "request_duration_seconds", "Time to answer POST /predict.", LATENCY_BUCKETS
        )
        self.batch_rows = Histogram(
            "batch_rows", "Rows per model call (dynamic batching).", SIZE_BUCKETS
        )
        self.batch_requests = Histogram(
            "batch_requests", "Requests per model call (dynamic batching).", SIZE_BUCKETS
        )

    def request_done(self, path: str, status: int, seconds: float | None = None) -> None:
        self.requests[(path, status)] += 1
        if seconds is not None:
            self.latency.observe(seconds)

    def batch_done(self, requests: int, rows: int) -> None:
        self.model_calls += 1
        self.rows += rows
        self.batch_rows.observe(rows)
        self.batch_requests.observe(requests)

    def render(self) -> str:
        lines = [
            f"# HELP {PREFIX}_requests_total HTTP requests answered, by path and status code.",
            f"# TYPE {PREFIX}_requests_total counter",
        ]
        for (path, status), count in sorted(self.requests.items()):
            lines.append(f'{PREFIX}_requests_total{{path="{path}",code="{status}"}} {count}')
        lines += _single("rows_total", "counter", "Rows predicted.", self.rows)
        lines += _single("model_calls_total", "counter", "Model calls.", self.model_calls)
        lines += _single("in_flight", "gauge", "Predict requests in progress.", self.in_flight)
        for histogram in (self.latency, self.batch_rows, self.batch_requests):
            lines += histogram.lines()
        return "\n".join(lines) + "\n"


def _single(name: str, kind: str, help_text: str, value: float) -> list[str]:
    full = f"{PREFIX}_{name}"
    return [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}", f"{full} {_number(value)}"]


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)
