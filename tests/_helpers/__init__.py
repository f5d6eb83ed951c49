"""What several test files share: waiting on a condition with a deadline, a free port, a real
S3 server. tests/ is on ``sys.path`` (the root conftest's folder), so any test imports these as
``from _helpers import wait_until``; fixtures stay in the conftest files."""

from __future__ import annotations

from _helpers.network import free_port
from _helpers.s3 import moto_s3
from _helpers.signals import ctrl_c_default
from _helpers.waiting import wait_for_file, wait_until

__all__ = ["ctrl_c_default", "free_port", "moto_s3", "wait_for_file", "wait_until"]
