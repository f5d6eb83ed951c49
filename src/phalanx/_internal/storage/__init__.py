"""A run's storage: the store contract (``store.py``) and the stores that implement it.

Importing the package registers the stores, so ``RunStorage(filesystem, ...)`` can choose one.
"""

from phalanx._internal.storage import local_store, object_store  # noqa: F401  (registers them)
