"""BatchPredictor on 2 local worker processes vs a single-process loop."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from phalanx.predict import BatchPredictor

torch = pytest.importorskip("torch")
from test_predictors import make_checkpoint, make_frame  # noqa: E402

from phalanx.predict import TorchPredictor  # noqa: E402


@pytest.fixture
def parquet_folder(tmp_path):
    df = make_frame(1003)  # not a multiple of the worker count: no row may be dropped
    folder = tmp_path / "raw"
    folder.mkdir()
    for i, start in enumerate((0, 400, 700)):
        df.iloc[start : (400, 700, 1003)[i]].to_parquet(
            folder / f"f{i}.parquet", row_group_size=128
        )
    return str(folder), df


@pytest.mark.slow
def test_two_workers_match_a_single_process_loop(parquet_folder, tmp_path):
    folder, df = parquet_folder
    checkpoint, _, _ = make_checkpoint(make_frame())
    single = TorchPredictor.from_checkpoint(checkpoint, model=torch.nn.Linear(2, 1))
    want = np.concatenate(
        [
            np.stack(single.predict(df.iloc[i : i + 100], feature_columns=["x"])["predictions"])
            for i in range(0, len(df), 100)
        ]
    )
    bp = BatchPredictor.from_checkpoint(checkpoint, TorchPredictor, model=torch.nn.Linear(2, 1))
    out_dir = str(tmp_path / "preds")
    got = bp.predict(
        folder,
        num_workers=2,
        batch_size=100,
        feature_columns=["x"],
        keep_columns=["id"],
        output_path=out_dir,
    ).to_pandas()
    assert list(got.columns) == ["predictions", "id"]
    assert got["id"].tolist() == list(range(1003))  # every row, in input order
    np.testing.assert_allclose(np.stack(got["predictions"]), want, rtol=1e-6)
    again = pd.read_parquet(out_dir)
    assert len(again) == 1003


def test_bad_arguments_fail_before_any_worker_starts(parquet_folder):
    folder, _ = parquet_folder
    checkpoint, _, _ = make_checkpoint(make_frame())
    bp = BatchPredictor(checkpoint, TorchPredictor, model=torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match=r"keep_columns.*\['nope'\]"):
        bp.predict(folder, keep_columns=["nope"])
    with pytest.raises(TypeError, match="Predictor subclass"):
        BatchPredictor(checkpoint, TorchPredictor(torch.nn.Linear(2, 1)))  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_progress_bar_counts_every_row(parquet_folder, capsys):
    folder, _ = parquet_folder
    checkpoint, _, _ = make_checkpoint(make_frame())
    bp = BatchPredictor.from_checkpoint(checkpoint, TorchPredictor, model=torch.nn.Linear(2, 1))
    out = bp.predict(folder, num_workers=2, batch_size=64, feature_columns=["x"], progress=True)
    assert out.count() == 1003
    # Drawn on stderr (phalanx's status line, like tqdm), ending with the final count.
    assert capsys.readouterr().err.endswith("scoring [" + "#" * 30 + "] 1003/1003 rows\n")
