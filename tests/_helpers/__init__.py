"""What several test files share: waiting on a condition with a deadline, a free port, a real
S3 server, a one-worker fit() on the thread engine, a fit() on a thread while the test acts, the
worker nodes a test adds to a fake Ray cluster. tests/ is on ``sys.path`` (the root
conftest's folder), so any test imports these as ``from _helpers import wait_until``; fixtures
stay in the conftest files."""

from __future__ import annotations

from _helpers.background_fit import fit_in_thread, fit_result
from _helpers.fits import fit_on_thread_engine
from _helpers.network import HeldLink, free_port
from _helpers.ray_nodes import WorkerNodes, elastic_group
from _helpers.s3 import moto_s3
from _helpers.signals import ctrl_c_default
from _helpers.waiting import wait_for_file, wait_until

__all__ = [
    "HeldLink",
    "WorkerNodes",
    "ctrl_c_default",
    "elastic_group",
    "fit_in_thread",
    "fit_on_thread_engine",
    "fit_result",
    "free_port",
    "moto_s3",
    "wait_for_file",
    "wait_until",
]
