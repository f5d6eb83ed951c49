"""phalanx serve's /metrics page is prometheus_client's: a Prometheus text parser reads every
series, and two apps in one process keep their own counts."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

from phalanx.serve._metrics import ServeMetrics


def samples(metrics: ServeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_page_parses_and_counts_what_the_server_did():
    metrics = ServeMetrics()
    metrics.in_flight += 1
    metrics.request_done("/predict", 200, 0.004)
    metrics.request_done("/predict", 422)
    metrics.batch_done(requests=3, rows=10)
    metrics.in_flight -= 1
    got = samples(metrics)
    assert got[("phalanx_serve_requests_total", (("code", "200"), ("path", "/predict")))] == 1
    assert got[("phalanx_serve_requests_total", (("code", "422"), ("path", "/predict")))] == 1
    assert got[("phalanx_serve_rows_total", ())] == 10
    assert got[("phalanx_serve_model_calls_total", ())] == 1
    assert got[("phalanx_serve_in_flight", ())] == 0
    assert got[("phalanx_serve_request_duration_seconds_count", ())] == 1  # 422: not timed
    assert got[("phalanx_serve_batch_requests_sum", ())] == 3
    assert got[("phalanx_serve_batch_rows_bucket", (("le", "8.0"),))] == 0
    assert got[("phalanx_serve_batch_rows_bucket", (("le", "16.0"),))] == 1


def test_two_apps_in_one_process_keep_their_own_counts():
    first, second = ServeMetrics(), ServeMetrics()
    first.batch_done(requests=1, rows=5)
    assert samples(second)[("phalanx_serve_rows_total", ())] == 0
    assert samples(first)[("phalanx_serve_rows_total", ())] == 5
