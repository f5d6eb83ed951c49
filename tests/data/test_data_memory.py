"""Streaming keeps memory bounded: iterate Parquet data 4x larger than the memory allowed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

COLUMNS = 64
ROWS_PER_GROUP = 50_000
GROUPS = 32  # 32 x 50k rows x 64 float32 = 390 MiB of data
CAP_MB = 96

READER = textwrap.dedent(
    """
    import json, resource, sys
    import phalanx.data

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    (shard,) = phalanx.data.read_parquet(sys.argv[1]).streaming_split(1)
    before = peak_mb()
    rows = 0
    for epoch in range(2):
        for batch in shard.iter_batches(batch_size=1024, prefetch_batches=4):
            rows += len(batch["c0"])
    print(json.dumps({"rows": rows, "growth_mb": peak_mb() - before}))
    """
)


@pytest.mark.slow
def test_iterating_a_dataset_larger_than_the_cap_stays_under_it(tmp_path):
    path = tmp_path / "big.parquet"
    schema = pa.schema([(f"c{i}", pa.float32()) for i in range(COLUMNS)])
    block = np.random.default_rng(0).random((COLUMNS, ROWS_PER_GROUP), dtype=np.float32)
    table = pa.table(list(block), schema=schema)
    options = {"compression": "none", "use_dictionary": False, "write_statistics": False}
    with pq.ParquetWriter(path, schema, **options) as writer:
        for _ in range(GROUPS):  # the same rows again and again: quick to write
            writer.write_table(table)
    data_mb = path.stat().st_size / 2**20
    assert data_mb >= 4 * CAP_MB
    done = subprocess.run(
        [sys.executable, "-c", READER, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["rows"] == 2 * GROUPS * ROWS_PER_GROUP
    assert result["growth_mb"] < CAP_MB, (result, f"data: {data_mb:.0f} MB")
