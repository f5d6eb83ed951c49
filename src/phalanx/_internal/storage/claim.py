"""Who holds a run: the owner a store's claim records, and the error a second owner gets."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass

from phalanx.errors import StorageError

LOCK_FILE = ".phalanx_lock"
LEASE_FILE = ".phalanx_lease.json"
HEARTBEAT_S = 10.0
STALE_S = 60.0
SETTLE_S = 0.5


@dataclass(frozen=True)
class Owner:
    token: str
    host: str
    pid: int
    since: float
    heartbeat: float

    @classmethod
    def me(cls, token: str | None = None) -> Owner:
        """This process, holding the run with ``token`` (its store's ``owner``: fencing)."""
        now = time.time()
        return cls(token or uuid.uuid4().hex, socket.gethostname(), os.getpid(), now, now)

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host}, pid {self.pid}, since {since}"

    def to_json(self) -> bytes:
        return json.dumps(vars(self)).encode()

    @classmethod
    def from_json(cls, data: bytes | None) -> Owner | None:
        try:
            return cls(**json.loads(data or b""))
        except (ValueError, TypeError):
            return None


def locked_error(name: str, run_uri: str, holder: Owner | None) -> StorageError:
    who = holder.describe() if holder is not None else "an owner that is starting up"
    return StorageError(
        f"Run {name!r} at {run_uri!r} is in use by another fit() ({who}).\n"
        "Two fit() calls writing one run directory would corrupt each other's checkpoints.\n"
        "HINT: give this run another RunConfig(name=...), or wait for the other fit() to end "
        "(leave name unset for a new unique name on every fit())."
    )
