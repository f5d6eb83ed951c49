"""Train a small XGBoost model with a preprocessor, then serve its run over HTTP and query it.

    python examples/serve_xgboost.py

The run goes to ~/phalanx_results/serve_xgboost (under $PHALANX_STORAGE_PATH if set; run again,
the script resumes it: its model has all its rounds, so nothing is trained twice). The same from
a shell, once the run exists:

    phalanx serve ~/phalanx_results/serve_xgboost       # the run's best checkpoint, port 8000
    curl -s localhost:8000/predict -d '{"records": [{"a": 10.5, "b": -3.9}]}'
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pandas as pd

import phalanx
import phalanx.serve
from phalanx.predict import XGBoostPredictor
from phalanx.preprocess import StandardScaler
from phalanx.xgboost import XGBoostTrainer


def make_data(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    a, b = rng.normal(10, 3, rows), rng.normal(-4, 0.5, rows)
    return pd.DataFrame({"a": a, "b": b, "y": (a - 10 + 4 * (b + 4) > 0).astype(int)})


def post(url: str, payload: dict) -> dict:
    body, headers = json.dumps(payload).encode(), {"Content-Type": "application/json"}
    request = urllib.request.Request(url, body, headers, method="POST")
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def main() -> None:
    result = XGBoostTrainer(
        datasets={"train": make_data(2000, 0)},
        label_column="y",
        params={"objective": "binary:logistic", "max_depth": 3},
        num_boost_round=20,
        preprocessor=StandardScaler(["a", "b"]),  # saved in the checkpoint, applied when serving
        scaling_config=phalanx.ScalingConfig(num_workers=2),
        run_config=phalanx.RunConfig(name="serve_xgboost"),  # ~/phalanx_results/serve_xgboost
    ).fit()

    rows = make_data(5, 1).drop(columns=["y"])
    with phalanx.serve.serve(result.path, port=0) as server:  # port 0: any free port
        answer = post(f"{server.url}/predict", {"records": rows.to_dict("records")})
        with urllib.request.urlopen(f"{server.url}/metadata") as response:
            print("metadata:", json.loads(response.read()))
    print("served:   ", np.round(answer["predictions"], 4))
    local = XGBoostPredictor.from_checkpoint(result.checkpoint).predict(rows)["predictions"]
    print("predictor:", np.round(local.to_numpy(), 4))


if __name__ == "__main__":
    main()
