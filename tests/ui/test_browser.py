"""The viewer in a real browser (Debian's chromium, driven by Playwright) against a viewer
serving on 127.0.0.1: every page draws without a console error, and each leaves a screenshot
under the test's tmp dir (``python bench/ui_screenshots.py`` copies them into docs/images/)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from _helpers import fit_in_thread, fit_result
from _helpers.browser import CHROMIUM, chromium

import phalanx as train
import phalanx.ui
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

pytest.importorskip("playwright")
from playwright.sync_api import expect

if not os.path.exists(CHROMIUM):
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)

pytestmark = pytest.mark.slow
STEP = threading.Event()  # the live run reports its next step when set
DONE = threading.Event()


def live_loop(config):
    train.report({"step": 1, "loss": 1.0})
    for step in (2, 3):
        STEP.wait(60)
        STEP.clear()
        if DONE.is_set():  # the test ended early
            return
        train.report({"step": step, "loss": 1.0 / step})
    DONE.wait(60)


@pytest.fixture(scope="module")
def viewer(runs):
    with phalanx.ui.start(str(runs)) as served:
        yield served


@pytest.fixture(scope="module")
def browser():
    with chromium() as context:
        yield context


@pytest.fixture
def page(browser, request, tmp_path):
    """A page whose console errors fail the test, screenshotted at the end."""
    opened = browser.new_page()
    errors: list[str] = []
    opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    opened.on("pageerror", lambda e: errors.append(str(e)))
    yield opened
    shot = tmp_path / f"{request.node.name}.png"
    opened.screenshot(path=str(shot), full_page=True)
    opened.close()
    assert not errors, errors


def painted(page):
    page.wait_for_selector("body[data-painted]", timeout=10_000)


def test_list_shows_the_runs(viewer, page):
    page.goto(viewer.url + "/")
    painted(page)
    rows = page.locator("#runs tbody tr")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.run)")) == [
        "broken",
        "good",
        "other",
    ]
    assert "failed" in page.locator('tr[data-run="broken"]').inner_text()
    page.fill("input[type=search]", "oth")
    assert rows.count() == 1


def test_run_page_draws_its_charts_and_names_its_metrics(viewer, page):
    page.goto(viewer.url + "/run/good")
    painted(page)
    charts = page.locator("#charts .chart")
    assert sorted(charts.evaluate_all("cs => cs.map(c => c.dataset.metric)")) == [
        "accuracy",
        "loss",
    ]
    assert page.locator("#charts canvas").count() == 2  # uPlot drew them
    assert page.locator('dd[data-metric="loss"]').inner_text() == "0.4762"
    assert "Attempt 2" in page.locator("#attempts").inner_text()
    assert "checkpoint_000011" in page.locator("#checkpoints").inner_text()
    page.locator('tr[data-rank="0"] button').click()
    expect(page.locator("pre.logtext")).to_contain_text("lost the node")


def test_failed_run_shows_its_traceback(viewer, page):
    page.goto(viewer.url + "/run/broken")
    painted(page)
    traceback = page.locator("#attempts pre.traceback").inner_text()
    assert "ZeroDivisionError: division by zero" in traceback and "return 1 / 0" in traceback
    assert "Root cause: rank 0" in page.locator("#attempts").inner_text()


def test_compare_overlays_two_runs(viewer, page):
    page.goto(viewer.url + "/compare?runs=good,other")
    painted(page)
    legend = page.locator('.chart[data-metric="loss"] .u-legend').inner_text()
    assert "good" in legend and "other" in legend
    assert "train_loop_config.lr" in page.locator("#config").inner_text()


def test_a_live_runs_new_step_appears_without_a_reload(viewer, page, runs):
    trainer = DataParallelTrainer(
        live_loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="live", storage_path=str(runs), verbose=0),
    )
    runner, outcome = fit_in_thread(trainer)
    try:
        page.goto(viewer.url + "/run/live")
        step_shown = page.locator('dd[data-metric="step"]')
        expect(step_shown).to_have_text("1", timeout=30_000)
        page.evaluate("window.__loaded = true")  # gone if the page reloads
        for step in ("2", "3"):
            STEP.set()
            reported = time.monotonic()
            expect(step_shown).to_have_text(step, timeout=4_000)
            assert time.monotonic() - reported < 2.0  # it polls every 0.5 s
        assert page.evaluate("window.__loaded") is True
        assert "running" in page.locator("h1").inner_text()
    finally:
        DONE.set()
        STEP.set()
        fit_result(runner, outcome, 60)
