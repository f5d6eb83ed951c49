"""Fixtures of the storage tests: one moto server that the S3 cases of several modules share."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import moto_s3

S3_BUCKET = "storage"


@pytest.fixture(scope="package")
def moto_fs() -> Iterator[Any]:
    """An s3fs filesystem on a moto server started once for the tests that ask for it, with the
    bucket ``S3_BUCKET``; each test writes under its own ``s3_root``."""
    with moto_s3(S3_BUCKET) as fs:
        yield fs


@pytest.fixture
def s3_root(moto_fs: Any) -> str:
    """A fresh prefix in the shared bucket: no test sees another's objects."""
    return f"s3://{S3_BUCKET}/{uuid.uuid4().hex[:8]}"
