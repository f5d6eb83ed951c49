"""The engine a contract test runs on: one fixture parameter per engine (and per start path).

To prove a new engine, or a new way for an engine to start its workers, add one ``EngineCase``
to ``CASES``: every test in tests/engines/ then runs on it too. ``env`` is set for the module's
tests on that case (before any test's leak snapshot) and restored after, as ``local-spawn`` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from _leaks import no_leaks as check_no_leaks
from _leaks import ray_tolerant


@dataclass(frozen=True)
class EngineCase:
    id: str
    engine: str
    """``ScalingConfig.engine``."""
    processes: bool
    """Each worker is its own process: it has its own pid and output, and can be killed."""
    env: dict[str, str] = field(default_factory=dict)


CASES = [
    EngineCase("thread", "thread", processes=False),
    EngineCase("local", "local", processes=True),
    # The local engine's portable start path (a spawn server; chosen off Linux, or after CUDA).
    EngineCase("local-spawn", "local", processes=True, env={"PHALANX_START_METHOD": "spawn"}),
    EngineCase("ray", "ray", processes=True),
]


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def engine(request: pytest.FixtureRequest) -> Iterator[EngineCase]:
    # Module-scoped: Ray starts, and the case's env is set, before a test's leak snapshot.
    case: EngineCase = request.param
    if case.engine == "ray":
        request.getfixturevalue("local_ray")
    before = {key: os.environ.get(key) for key in case.env}
    os.environ.update(case.env)
    try:
        yield case
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    # Ray's own processes (started once for the module) may outlive a test; nothing else may.
    with check_no_leaks(ray_tolerant):
        yield


@pytest.fixture
def process_engine(engine: EngineCase) -> EngineCase:
    """``engine``, for a behaviour that needs each worker in a process of its own."""
    if not engine.processes:
        pytest.skip(f"the {engine.id} engine's workers are threads of the driver")
    return engine
