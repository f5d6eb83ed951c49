"""The run's Prometheus endpoint: scraped during a real run with a plain HTTP client and read
with prometheus_client's own text parser, its counters move; it binds 127.0.0.1 unless told
otherwise; every query of the shipped Grafana dashboard names a series it exports."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from _helpers import free_port, wait_until
from prometheus_client.parser import text_string_to_metric_families

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig
from phalanx._foundation.goodput_parts import PARTS
from phalanx._internal.controller.goodput import GoodputClock
from phalanx._internal.controller.metrics_endpoint import EXPORTED, start_endpoint

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "phalanx.json"
DEADLINE_S = 60.0


def scrape(port: int) -> dict[str, float]:
    """Every sample as ``name{label=value,...}`` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def gated_loop(config):
    """Three rounds, then wait for the test's first scrape; three more, then the second."""
    for gate in ("first", "second"):
        for _ in range(3):
            train.report({"loss": 1.0})
        path = os.path.join(config["gates"], gate)
        deadline = time.monotonic() + DEADLINE_S
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)


def test_scraped_during_a_run_the_counters_move(tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv("PHALANX_METRICS_PORT", str(port))
    gates = tmp_path / "gates"
    gates.mkdir()
    seen: list[dict[str, float]] = []

    def scraper() -> None:
        for gate, rounds in (("first", 3), ("second", 6)):
            key = "phalanx_train_rounds_total{run=scraped}"

            def reached(rounds: int = rounds, key: str = key) -> dict[str, float] | None:
                try:
                    samples = scrape(port)
                except OSError:  # not serving yet
                    return None
                return samples if samples.get(key, 0) >= rounds else None

            seen.append(wait_until(reached, DEADLINE_S, f"{rounds} rounds"))
            (gates / gate).touch()

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        DataParallelTrainer(
            gated_loop,
            train_loop_config={"gates": str(gates)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="scraped", storage_path=str(tmp_path / "runs")),
        ).fit()
    finally:
        for gate in ("first", "second"):
            (gates / gate).touch()
        thread.join(DEADLINE_S)
    first, second = seen
    run = "run=scraped"
    assert first[f"phalanx_train_rounds_total{{{run}}}"] == 3
    assert second[f"phalanx_train_rounds_total{{{run}}}"] == 6
    assert second[f"phalanx_train_reports_total{{{run}}}"] == 12
    assert second[f"phalanx_train_attempts_total{{{run}}}"] == 1
    assert second[f"phalanx_train_failures_total{{{run}}}"] == 0
    for rank in (0, 1):  # the scrape came after the rank's second report: a step time
        assert f"phalanx_train_step_seconds{{rank={rank},{run}}}" in second
    wall = f"phalanx_train_wall_seconds{{{run}}}"
    assert second[wall] > first[wall]
    parts = {p: second[f"phalanx_train_goodput_seconds{{part={p},{run}}}"] for p in PARTS}
    assert sum(parts.values()) == pytest.approx(second[wall], rel=0.02)
    assert parts["productive"] > 0 and parts["startup"] > 0
    with pytest.raises(OSError):  # the endpoint ends with the run
        scrape(port)


def test_the_endpoint_binds_loopback_unless_told_otherwise(monkeypatch):
    monkeypatch.setenv("PHALANX_METRICS_PORT", "0")
    monkeypatch.delenv("PHALANX_METRICS_HOST", raising=False)
    endpoint = start_endpoint("run", GoodputClock())
    assert endpoint is not None
    try:
        assert endpoint._server.server_address[0] == "127.0.0.1"
        names = {name.split("{")[0] for name in scrape(endpoint.port)}
        per_rank = {
            "phalanx_train_step_seconds",
            "phalanx_train_last_to_report_total",
            "phalanx_train_step_part_seconds",
            "phalanx_train_straggler_excess_seconds",
        }
        assert names == set(EXPORTED) - per_rank  # per-rank series appear with the first ranks
    finally:
        endpoint.close()


def test_a_busy_port_is_a_warning_and_the_run_goes_on(monkeypatch, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("PHALANX_METRICS_PORT", str(taken.getsockname()[1]))
        assert start_endpoint("run", GoodputClock()) is None
    assert "HINT: set PHALANX_METRICS_PORT to a free port" in caplog.text


def test_every_grafana_panel_queries_a_series_the_endpoint_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert panels
    plotted = set()
    for panel in panels:
        targets = panel.get("targets", [])
        assert targets, f"panel {panel.get('title')!r} has no query"
        for target in targets:
            names = set(re.findall(r"\bphalanx_[a-z_]+\b", target["expr"]))
            assert names, f"{panel['title']!r}: {target['expr']!r} names no phalanx series"
            assert names <= set(EXPORTED), f"{panel['title']!r}: {names - set(EXPORTED)}"
            plotted |= names
    # and every series is plotted somewhere
    assert plotted == set(EXPORTED)
