"""phalanx.lightgbm: distributed LightGBM (Ray Train's ``ray.train.lightgbm``).

``LightGBMTrainer`` trains one model on the shards of several workers through LightGBM's own
network; ``get_network_params()`` gives your training function the parameters for it, and
``ReportCallback`` (alias ``RayTrainReportCallback``) reports each round's eval metrics and saves
checkpoints from your own ``lightgbm.train`` call.
``LightGBMCheckpoint`` holds a booster (``from_model`` / ``get_model``) and ``LightGBMPredictor`` scores
batches with one, as ``ray.train.lightgbm`` did in AIR.
"""

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra(
    "phalanx.lightgbm", "lightgbm", "numpy", "pandas", "pyarrow", extra="lightgbm"
):
    raise _missing

from phalanx._foundation.module_aliases import keep_old_module_paths as _keep_old_paths
from phalanx.lightgbm._callback import RayTrainReportCallback, ReportCallback
from phalanx.lightgbm._checkpoint import LightGBMCheckpoint
from phalanx.lightgbm._config import LightGBMConfig
from phalanx.lightgbm._network import get_network_params
from phalanx.lightgbm._pandas_dtypes import normalize_pandas_for_lightgbm
from phalanx.lightgbm._predictor import LightGBMPredictor
from phalanx.lightgbm._trainer import LightGBMTrainer

# A LightGBMCheckpoint pickled before the module was renamed names this path.
_keep_old_paths(__name__, ["checkpoint"])

__all__ = [
    "LightGBMCheckpoint",
    "LightGBMConfig",
    "LightGBMPredictor",
    "LightGBMTrainer",
    "RayTrainReportCallback",
    "ReportCallback",
    "get_network_params",
    "normalize_pandas_for_lightgbm",
]
