"""A real S3-compatible server (moto) on 127.0.0.1 and an s3fs filesystem pointed at it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def moto_s3(*buckets: str) -> Iterator[Any]:
    """Start a moto server, make ``buckets``, yield an ``s3fs.S3FileSystem`` on it (its
    endpoint is ``fs.client_kwargs["endpoint_url"]``); stop the server on exit. Skips the test
    when moto or s3fs is missing."""
    s3fs = pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = {"endpoint_url": f"http://{host}:{port}", "region_name": "us-east-1"}
        # boto3, not fs.mkdir: s3fs sends us-east-1 as a LocationConstraint, which S3 refuses
        client = boto3.client(
            "s3", aws_access_key_id="testing", aws_secret_access_key="testing", **endpoint
        )
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs=endpoint)
    finally:
        server.stop()
