"""``phalanx migrate``: port Ray Train code to phalanx, keeping comments and formatting.

A libcst codemod. Every Ray Train import form (``import ray``, ``import ray.train as train``,
``from ray import train``, ``from ray.train.torch import ...``, ``ray.train.v2.*``, ``ray.air.*``)
and every use of what it binds (``ray.train.report``, ``ray.data.from_pandas``,
``session.get_world_rank()``) becomes its phalanx equivalent; what phalanx has no equivalent for
(Ray Tune, most of Ray Serve, some Ray Data functions) is left as it is and listed. Ray Core
(``ray.remote``, ``ray.get``, ``ray.init(address=...)``) stays, and so does ``import ray``; a bare
``ray.init()`` / ``ray.shutdown()`` is removed when nothing else needs Ray. The rules are data:
:mod:`phalanx.migrate._rules`.

>>> migrated = migrate_source("import ray.train\\nray.train.report({'loss': 1.0})\\n")
>>> print(migrated.code, end="")
import phalanx
phalanx.report({'loss': 1.0})
"""

from __future__ import annotations

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra("phalanx.migrate", "libcst", extra="migrate"):
    raise _missing

from phalanx.migrate._codemod import Migration, migrate_source
from phalanx.migrate._collect import Attention

__all__ = ["Attention", "Migration", "migrate_source"]
