"""phalanx.xgboost: distributed XGBoost (Ray Train's ``ray.train.xgboost``).

``XGBoostTrainer`` trains one model on the shards of several workers through XGBoost's own
collective; ``ReportCallback`` (alias ``RayTrainReportCallback``) reports each round's eval
metrics and saves checkpoints from your own ``xgboost.train`` call.
``XGBoostCheckpoint`` holds a booster (``from_model`` / ``get_model``) and ``XGBoostPredictor`` scores
batches with one, as ``ray.train.xgboost`` did in AIR.
"""

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra(
    "phalanx.xgboost", "xgboost", "numpy", "pandas", "pyarrow", extra="xgboost"
):
    raise _missing

from phalanx._foundation.module_aliases import keep_old_module_paths as _keep_old_paths
from phalanx.xgboost._callback import RayTrainReportCallback, ReportCallback
from phalanx.xgboost._checkpoint import XGBoostCheckpoint
from phalanx.xgboost._config import XGBoostConfig
from phalanx.xgboost._predictor import XGBoostPredictor
from phalanx.xgboost._trainer import XGBoostTrainer

# A XGBoostCheckpoint pickled before the module was renamed names this path.
_keep_old_paths(__name__, ["checkpoint"])

__all__ = [
    "RayTrainReportCallback",
    "ReportCallback",
    "XGBoostCheckpoint",
    "XGBoostConfig",
    "XGBoostPredictor",
    "XGBoostTrainer",
]
