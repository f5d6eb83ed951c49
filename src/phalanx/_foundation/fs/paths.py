"""Names that become paths: a run's name, a checkpoint directory's name, a snapshot entry.

Every one of them is a single path component, so nothing phalanx writes or deletes can land
outside ``<storage_path>/<name>``. Checked where the name enters (``RunConfig``, ``report()``,
the snapshot loader) and once more in ``RunStorage.path`` whatever the caller passed.
"""

from __future__ import annotations

# Entries phalanx itself keeps in a run directory (kept in step with run_storage.py by a test).
RESERVED_IN_RUN = frozenset(
    {
        "checkpoint_manager_snapshot.json",
        "checkpoint_manager_snapshot.json.tmp",
        "metrics.jsonl",
        "metrics_all_ranks.jsonl",
        ".staging",
        "logs",
        "error.txt",
        "error.pkl",
        ".phalanx_run",
    }
)
RESERVED_PREFIX = ".phalanx"  # private files phalanx may add (locks, upload scratch)


def default_checkpoint_dir_name(round_index: int) -> str:
    """The name of a checkpoint reported without ``checkpoint_dir_name``: the same on every rank
    with no coordination, because every rank's k-th report is round k."""
    return f"checkpoint_{round_index:06d}"


def component_problem(value: object) -> str | None:
    """Why ``value`` cannot be one path component, or None if it can."""
    if not isinstance(value, str):
        return f"it is of type {type(value).__name__}, not a string"
    if not value:
        return "it is empty"
    if value in (".", ".."):
        return f"{value!r} names a directory relative to another one"
    if "/" in value or "\\" in value:
        return "it contains a path separator"
    if "\0" in value:
        return "it contains a NUL character"
    return None


def checkpoint_name_problem(value: object) -> str | None:
    """Why ``value`` cannot name a checkpoint directory inside a run, or None if it can."""
    problem = component_problem(value)
    if problem is not None:
        return problem
    assert isinstance(value, str)
    if value in RESERVED_IN_RUN or value.startswith(RESERVED_PREFIX):
        return f"phalanx keeps its own {value!r} in every run directory"
    return None


def check_checkpoint_dir_name(value: object) -> str:
    """``report(checkpoint_dir_name=...)``: a ValueError naming the problem, or the name."""
    problem = checkpoint_name_problem(value)
    if problem is not None:
        raise ValueError(
            f"report(checkpoint_dir_name={value!r}) is invalid: {problem}. A checkpoint is a "
            "directory directly inside the run directory, so its name is one path component.\n"
            "HINT: pass a plain name such as 'epoch_3', or None for checkpoint_<round>."
        )
    return value  # type: ignore[return-value]
