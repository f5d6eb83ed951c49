"""Import the GBDT libraries at collection: lightgbm sets KMP_* variables when imported, which
the leak check would otherwise blame on the first test that imports it."""

from __future__ import annotations

import contextlib

with contextlib.suppress(ImportError):
    import lightgbm  # noqa: F401
with contextlib.suppress(ImportError):
    import xgboost  # noqa: F401
with contextlib.suppress(ImportError):
    import jax  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL and TPU_SKIP_MDS_QUERY when imported)
