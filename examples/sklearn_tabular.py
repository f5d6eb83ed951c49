"""A scikit-learn estimator as a phalanx trainer: AIR's ``SklearnTrainer``, with phalanx.

Written as an AIR user wrote it; only the imports differ (``ray.train.sklearn`` ->
``phalanx.sklearn``, ``ray.data`` -> ``phalanx.data``). The data is synthetic, so it runs
anywhere, offline.

    python examples/sklearn_tabular.py                  # 20k rows, 3-fold CV, 2 CPUs
    python examples/sklearn_tabular.py --rows 100000 --cv 5 --cpus 2

The trainer fits the estimator in one worker with ``trainer_resources``' CPUs as its ``n_jobs``,
scores it on every other dataset (``valid/test_score``), cross-validates it (``cv/...``), and saves
a ``SklearnCheckpoint``; a ``SklearnPredictor`` then predicts from that checkpoint.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import pandas as pd
from sklearn.ensemble import RandomForestRegressor

import phalanx.data
from phalanx import RunConfig, ScalingConfig
from phalanx.sklearn import SklearnPredictor, SklearnTrainer


def make_data(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    y = np.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.normal(size=rows)
    return pd.DataFrame({**{f"x{i}": x[:, i] for i in range(8)}, "y": y})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--cv", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--storage-path", default=tempfile.mkdtemp(prefix="sklearn_example_"))
    args = parser.parse_args()

    df = make_data(args.rows)
    cut = int(len(df) * 0.8)
    trainer = SklearnTrainer(
        estimator=RandomForestRegressor(n_estimators=50, max_depth=10, random_state=0),
        label_column="y",
        datasets={
            "train": phalanx.data.from_pandas(df.iloc[:cut]),
            "valid": phalanx.data.from_pandas(df.iloc[cut:]),
        },
        cv=args.cv,
        scaling_config=ScalingConfig(trainer_resources={"CPU": args.cpus}),
        run_config=RunConfig(name="sklearn_tabular", storage_path=args.storage_path),
    )
    result = trainer.fit()
    print(f"fit_time {result.metrics['fit_time']:.2f} s")
    print(f"valid R^2 {result.metrics['valid']['test_score']:.3f}")
    print(f"cv R^2    {result.metrics['cv']['test_score_mean']:.3f} over {args.cv} folds")

    predictor = SklearnPredictor.from_checkpoint(result.checkpoint)
    sample = df.drop(columns="y").iloc[:5]
    print(predictor.predict(sample))


if __name__ == "__main__":
    main()
