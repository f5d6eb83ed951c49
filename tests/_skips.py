"""The skips a full run may have, each with its reason; any other skip fails the run.

A skip hides a test: with every extra installed (``.ci/run`` installs them all), a test skipped
for a missing package, a broken import or a script not on PATH tests nothing while the run looks
green. With ``--fail-on-unexpected-skip`` (``.ci/run`` passes it), a run whose tests all passed
exits 1 if some test was skipped for a reason not listed in ``ALLOWED_SKIPS``, and names it.

A pytest plugin: tests/conftest.py imports its hooks; ``-p _skips`` loads it elsewhere.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

OPTION = "--fail-on-unexpected-skip"

# A regular expression searched in the skip's reason -> why that skip is expected.
ALLOWED_SKIPS: dict[str, str] = {
    r"engine's workers are threads of the driver": (
        "the engine contract runs every test on every engine; a per-process behaviour (a pid, "
        "a kill -9) does not exist on the thread engine"
    ),
    r"threads share one process": "the same, for the straggler and hang contract",
    r"as on the fork path: local covers it": (
        "a start path that changes nothing for this behaviour runs it once, on the local case"
    ),
    r"this machine has GPUs": "the CPU-only path is asserted only where there is no GPU",
    r"needs a CUDA GPU": "a GPU-only path (CUDA streams, pinned memory) runs where torch sees one",
    r"DeepSpeed is installed here": "the missing-DeepSpeed error is asserted only without it",
    r"cannot mount a tmpfs here": "a real full disk needs root and mount(8) (CAP_SYS_ADMIN)",
    r"needs /dev/full": "a container without /dev/full",
    r"the store lives in this process's memory": (
        "the SIGKILL form of the commit scenario needs files that outlive the killed process; "
        "in-memory stores run its in-process form"
    ),
    r"syncfs cannot be relied on here": "Linux < 5.8; the per-file fsync tests cover the path",
    r"network namespaces cannot be made here": (
        "the namespace hosts (tests/hosts/) need root and ip(8) on Linux; CI is root"
    ),
}


def unexpected(reason: str) -> bool:
    return not any(re.search(pattern, reason) for pattern in ALLOWED_SKIPS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        help="exit 1 if a test is skipped for a reason not listed in tests/_skips.py",
    )


class SkipCheck:
    """Collects the unexpected skips of one run; fails a run that passed otherwise."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        if unexpected(reason):
            self.found.append(f"{report.nodeid}: {reason}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.found:
            return
        terminalreporter.section("unexpected skips", sep="=", red=True, bold=True)
        for line in self.found:
            terminalreporter.line(line)
        terminalreporter.line(
            f"{len(self.found)} test(s) skipped for a reason not in tests/_skips.py "
            "ALLOWED_SKIPS: install what they need, fix what made them skip, or allow the "
            "reason there with why it is expected."
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.found and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(OPTION):
        config.pluginmanager.register(SkipCheck(), "phalanx-skip-check")
