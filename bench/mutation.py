"""Mutation testing of the data-contract modules: does the suite catch a bug put into them?

    python bench/mutation.py                      # every module in pyproject's [tool.mutmut]
    python bench/mutation.py src/phalanx/_internal/worker/metrics.py   # one module
    python bench/mutation.py src/phalanx/_internal/worker/metrics.py --tests tests/worker
    python bench/mutation.py src/phalanx/_internal/storage/lease.py --again  # after new tests
    python bench/mutation.py src/phalanx/_internal/storage/lease.py -k "not s3"  # without moto

mutmut (https://github.com/boxed/mutmut) makes one small change at a time (a mutant: ``<`` for
``<=``, a constant, a removed call) to the modules in ``[tool.mutmut] only_mutate`` and runs the
tests that cover the changed function; a mutant the tests still pass on *survived*. It is slow
(hours for every module on 2 cores), so it runs here, not in CI. Each module runs on its own, with
the smallest test subset that claims its behaviour (``MODULE_TESTS``; ``--tests`` overrides it),
in a scratch copy of src/, tests/ and pyproject.toml (mutmut writes a ``mutants/`` tree next to
the code). mutmut and its libcst are installed into a venv of their own
(``--system-site-packages``: phalanx and the test dependencies come from this environment),
so the project's pinned libcst is left alone.

The result, ``bench/results/mutation.md``: per module, killed / survived / not covered and the
score (killed over non-equivalent mutants), then every survivor with its diff. Each module's last
run is kept in ``bench/results/mutation.json``, so running one module updates its rows and the
total without running the others again. A survivor gets a test that kills it (in a
``tests/<folder>/test_<module>_mutants.py``; ``--again`` runs the last survivors against those
files), or an entry in ``EQUIVALENT`` below (no test can tell it apart: the one-line reason says
why). ``NOT_RUN`` names the mutants that would act outside the tests' temporary directories.
Not a comparative benchmark, so bench/harness.py is not used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tomllib

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "bench" / "results" / "mutation.md"
STORE = RESULT.with_suffix(".json")
MUTMUT = "mutmut==3.8.1"

# The tests that claim each module's behaviour: mutmut runs, for a mutant, those of them that
# call the mutated function. Kept small: each is run once per mutant it covers.
_COMMIT_TESTS = [
    "tests/storage/contract",
    "tests/storage/test_commit_fsync.py",
    "tests/storage/test_commit_small_checkpoint.py",
    "tests/storage/test_retention_table.py",
    "tests/storage/test_snapshot_next_round.py",
    "tests/storage/test_parts_join.py",
    "tests/storage/test_checkpoint_persistence.py",
    "tests/storage/test_local_store_mutants.py",
    "tests/storage/test_checkpoint_manager_mutants.py",
    "tests/storage/test_object_store_mutants.py",
]
_CLAIM_TESTS = [
    "tests/storage/test_run_lease.py",
    "tests/storage/test_run_lock.py",
    "tests/storage/test_lease_mutants.py",
    "tests/storage/test_claim_mutants.py",
    "tests/storage/test_run_lock_mutants.py",
]
MODULE_TESTS: dict[str, list[str]] = {
    "src/phalanx/_internal/worker/metrics.py": [
        "tests/worker/test_metrics_checks.py",
        "tests/worker",
    ],
    "src/phalanx/_internal/controller/rounds.py": [
        "tests/controller/test_drain_order.py",
        "tests/controller/test_steps.py",
        "tests/controller/test_report_rounds_table.py",
        "tests/controller/test_rounds_property.py",
        "tests/controller/test_rounds_mutants.py",
    ],
    "src/phalanx/_internal/controller/attempt.py": [
        "tests/controller/test_drain_order.py",
        "tests/controller/test_steps.py",
        "tests/controller/test_failure_policy.py",
        "tests/controller/test_park_on_retry.py",
        "tests/controller/test_failure_rounds.py",
        "tests/controller/test_controller.py",
        "tests/controller/test_attempt_mutants.py",
    ],
    "src/phalanx/_internal/controller/failure_policy.py": [
        "tests/controller/test_failure_policy.py",
        "tests/controller/test_failure_policy_mutants.py",
    ],
    "src/phalanx/_internal/storage/lease.py": _CLAIM_TESTS,
    "src/phalanx/_internal/storage/claim.py": _CLAIM_TESTS,
    "src/phalanx/_internal/storage/run_lock.py": _CLAIM_TESTS,
    "src/phalanx/_internal/storage/local_store.py": _COMMIT_TESTS,
    "src/phalanx/_internal/storage/object_store.py": _COMMIT_TESTS,
    "src/phalanx/_internal/storage/checkpoint_manager.py": _COMMIT_TESTS,
    # The layout and the guards every store shares: the contract suite runs each store over it.
    "src/phalanx/_internal/storage/run_storage.py": [
        "tests/storage/contract",
        "tests/storage/test_storage.py",
        "tests/storage/test_storage_errors.py",
        "tests/worker/test_storage_context.py",
        "tests/storage/test_checkpoint_persistence.py",
        "tests/storage/test_local_store_mutants.py",
        "tests/storage/test_object_store_mutants.py",
        "tests/storage/test_run_storage_mutants.py",
    ],
}

# Mutants never run: each would act outside the test's temporary directory. With a None source,
# move_tree_contents / os.scandir(None) moves the working directory's entries (mutmut's own tree)
# into the checkpoint. Run the module with ``--mutants`` naming every other mutant.
NOT_RUN: dict[str, str] = {
    f"phalanx._internal.storage.local_store.{name}": "moves the working directory's contents"
    for name in (
        "xǁLocalStoreǁstage_part__mutmut_8",  # _move_dir(None, target)
        "xǁLocalStoreǁ_commit_staged__mutmut_11",  # move_tree_contents(None, final)
        "x__move_dir__mutmut_19",  # move_tree_contents(None, dst)
    )
}
# root.rstrip("/") and "/": every run would live in /<name> (tests run as root here: /run).
NOT_RUN["phalanx._internal.storage.run_storage.xǁRunStorageǁcreate__mutmut_19"] = (
    "puts the run directory at /<name>, outside the test's storage"
)

# Mutants no test can tell apart from the original, by mutmut's name -> why.
EQUIVALENT: dict[str, str] = {
    "phalanx._internal.worker.metrics.x__convert__mutmut_45": (
        "zip(strict=None): items is built from value, so the lengths always agree"
    ),
    "phalanx._internal.worker.metrics.x__convert__mutmut_48": (
        "zip() without strict: items is built from value, so the lengths always agree"
    ),
    "phalanx._internal.worker.metrics.x__convert__mutmut_16": (
        "`or True` picks .tolist(): every numpy scalar and array has it (.item() is a fallback)"
    ),
    "phalanx._internal.storage.claim.xǁOwnerǁfrom_json__mutmut_3": (
        'data or b"XXXX": no data reads as no owner either way (b"" and b"XXXX" are both not JSON)'
    ),
    "phalanx._internal.storage.run_lock.xǁRunLockǁ__init____mutmut_1": (
        "RunLock.storage is never read: fit() keeps its own storage, release() uses the claim"
    ),
    "phalanx._internal.storage.run_lock.xǁRunLockǁacquire__mutmut_12": (
        "RunLock.storage is never read: fit() keeps its own storage, release() uses the claim"
    ),
    "phalanx._internal.storage.lease.x_lease_held__mutmut_10": (
        "<= for <: differs only when time.time() - heartbeat equals stale_s exactly (a float)"
    ),
    "phalanx._internal.storage.lease.xǁLeaseǁtake__mutmut_13": (
        "<= for <: differs only when time.time() - heartbeat equals stale_s exactly (a float)"
    ),
    "phalanx._internal.storage.lease.xǁLeaseǁ__init____mutmut_4": (
        "only take() hands out a Lease, and it sets _heartbeat to the started thread first"
    ),
    "phalanx._internal.storage.lease.xǁLeaseǁ_renew__mutmut_7": (
        "a beat every stale_s / 5 instead of / 4: the lease is renewed more often, still fresh"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁremove_orphans__mutmut_19": (
        "fsspec's ls(detail=False) names no entry with a trailing '/': the last component is the same"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁremove_orphans__mutmut_21": (
        "fsspec's ls(detail=False) names no entry with a trailing '/': the last component is the same"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁremove_orphans__mutmut_22": (
        "fsspec's ls(detail=False) names no entry with a trailing '/': the last component is the same"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁremove_orphans__mutmut_23": (
        "fsspec's ls(detail=False) names no entry with a trailing '/': the last component is the same"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁremove_orphans__mutmut_25": (
        "fsspec's ls(detail=False) names no entry with a trailing '/': the last component is the same"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁremove_orphans__mutmut_26": (
        "fsspec's ls(detail=False) names no entry with a trailing '/': the last component is the same"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁ_encoded__mutmut_1": (
        "the cache only saves re-encoding: an entry encodes to the same text either way"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁ_encoded__mutmut_2": (
        "the cache only saves re-encoding: an entry encodes to the same text either way"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁ_encoded__mutmut_5": (
        "the cache only saves re-encoding: an entry encodes to the same text either way"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁ_record__mutmut_30": (
        "a change puts at most one entry, so the separator is never written"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁ_deleter__mutmut_3": (
        "one deletion thread or several: the same directories are deleted before close() returns"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁ_deleter__mutmut_5": (
        "one deletion thread or several: the same directories are deleted before close() returns"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁ_deleter__mutmut_7": (
        "one deletion thread or several: the same directories are deleted before close() returns"
    ),
    "phalanx._internal.storage.local_store.x__file_lock_held__mutmut_6": (
        "O_RDONLY & O_CLOEXEC is O_RDONLY: only close-on-exec is lost, and the fd is closed before return"
    ),
    "phalanx._internal.storage.local_store.xǁFileLockǁtake__mutmut_26": (
        "pread of 4097 bytes, not 4096: an owner's JSON is far shorter than either"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁload__mutmut_45": (
        "read_state fills journal_seq where there is a journal; without one (object stores) it is never compared"
    ),
    "phalanx._internal.storage.checkpoint_manager.xǁCheckpointManagerǁremove_orphans__mutmut_11": (
        "fsspec's ls takes detail=None as False (a falsy flag): the same names"
    ),
    "phalanx._internal.storage.object_store.xǁObjectStoreǁcommit__mutmut_11": (
        "makedirs runs only when the checkpoint does not exist, so exist_ok never matters"
    ),
    "phalanx._internal.storage.object_store.xǁObjectStoreǁcommit__mutmut_13": (
        "makedirs runs only when the checkpoint does not exist, so exist_ok never matters"
    ),
    "phalanx._internal.storage.object_store.xǁObjectStoreǁcommit__mutmut_14": (
        "makedirs runs only when the checkpoint does not exist, so exist_ok never matters"
    ),
    "phalanx._internal.storage.object_store.xǁObjectStoreǁcommit__mutmut_22": (
        "rstrip(None) for rstrip('/'): a checkpoint path never ends in '/' or a space"
    ),
    "phalanx._internal.storage.object_store.xǁObjectStoreǁcommit__mutmut_23": (
        "lstrip('/') for rstrip('/'): an object-store path starts with the bucket, not '/'"
    ),
    "phalanx._internal.storage.object_store.xǁObjectStoreǁcommit__mutmut_24": (
        "rstrip('XX/XX'): a checkpoint path ends in its name, never in 'X' or '/'"
    ),
    "phalanx._internal.storage.local_store.x__fsync_tree__mutmut_18": (
        "how many threads flush: every path is flushed before the rename either way"
    ),
    "phalanx._internal.storage.local_store.x__fsync_tree__mutmut_23": (
        "how many threads flush: every path is flushed before the rename either way"
    ),
    "phalanx._internal.storage.local_store.x__fsync_tree__mutmut_24": (
        "how many threads flush: every path is flushed before the rename either way"
    ),
    "phalanx._internal.storage.local_store.x__fsync_tree__mutmut_25": (
        "how many threads flush: every path is flushed before the rename either way"
    ),
    "phalanx._internal.storage.local_store.x__fsync_tree__mutmut_27": (
        "how many threads flush: every path is flushed before the rename either way"
    ),
    "phalanx._internal.storage.local_store.xǁFileLockǁtake__mutmut_54": (
        "ftruncate to 1, not 0: the owner record written next at 0 is longer than 1 byte"
    ),
    "phalanx._internal.worker.metrics.x__convert__mutmut_49": (
        "zip(strict=False): items is built from value, so the lengths always agree"
    ),
    # attempt.py: timing only (how long a wait or a poll lasts), which no test may assert
    # under 5 s, or a float compared for equality
    "phalanx._internal.controller.attempt.xǁAttemptǁ_wait_exit_status__mutmut_1": (
        "waiting 1.5 s, not 0.5 s, for a live process's exit status: only later, never a different failure"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁ_wait_exit_status__mutmut_6": (
        "<= for <: differs only when time.monotonic() equals the deadline exactly (a float)"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁ_wait_exit_status__mutmut_8": (
        "polling is_alive() every 1 s, not 2 ms: the same exit status is read, at most a second later"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁawaiting_survivors__mutmut_21": (
        "<= for <: differs only when time.monotonic() equals the grace deadline exactly (a float)"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁrecord_failures__mutmut_7": (
        ">= for >: differs only when an exit is exactly EXIT_DRAIN_S old (a float)"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁrecord_failures__mutmut_20": (
        "returncode '' for None: a RemoteCallError is described by its remote error, never its code"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁrecord_failures__mutmut_37": (
        ">= for >: differs only when time.monotonic() equals the preemption deadline exactly"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁpoll_timeout__mutmut_1": (
        "a poll waits 0.8 s, not 0.05 s, while an exit drains: events wake it; the exit fails later"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁpoll_timeout__mutmut_2": (
        "a poll waits 0.04 s, not 0.05 s, while an exit drains: the same failure, polled more often"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁpoll_timeout__mutmut_8": (
        "a poll waits >= 1 s during the failure grace: events wake it; the grace ends at most 1 s late"
    ),
    "phalanx._internal.controller.attempt.xǁAttemptǁpoll_timeout__mutmut_13": (
        "a poll waits the usual 0.5 s, not to the grace's end: events wake it; it ends <= 0.5 s late"
    ),
    "phalanx._internal.storage.run_storage.xǁRunStorageǁ__init_subclass____mutmut_1": (
        "a store registered by default comes after LocalStore and ObjectStore, which serve every "
        "filesystem between them: never chosen"
    ),
    "phalanx._internal.storage.run_storage.xǁRunStorageǁserves__mutmut_1": (
        "the base class is never registered and every registered store has its own serves()"
    ),
    "phalanx._internal.storage.run_storage.xǁRunStorageǁprepare__mutmut_22": (
        "the marker's text in upper case: only whether .phalanx_run exists is ever read"
    ),
    "phalanx._internal.storage.run_storage.xǁRunStorageǁread__mutmut_15": (
        "fsspec's open() without a mode opens for 'rb' already"
    ),
    "phalanx._internal.storage.run_storage.x_merge_metadata__mutmut_8": (
        "fsspec's open() without a mode opens for 'rb', and json.load reads bytes as well"
    ),
}


def main() -> None:
    args = parse_args()
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    modules = args.modules or config["only_mutate"]
    work = Path(args.work_dir)
    mutmut = install_mutmut(work / "venv")
    for module in modules:
        tests = (
            args.tests or MODULE_TESTS.get(module) or config["pytest_add_cli_args_test_selection"]
        )
        tests = [t for t in tests if (REPO / t.split("::")[0]).exists()]
        print(f"{module}: mutating, tests {' '.join(tests)}", flush=True)
        run = run_module(mutmut, work / Path(module).stem, module, tests, args)
        store = load_store()  # read again: another module's run may have ended meanwhile
        store[module] = run
        STORE.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
        print(f"{module}: {score_line(store[module]['statuses'])}", flush=True)
    store = load_store()
    RESULT.write_text(render(store, config["only_mutate"], args))
    print(f"wrote {RESULT.relative_to(REPO)}: {score_line(all_statuses(store))}")


def run_module(
    mutmut: Path, copy: Path, module: str, tests: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """One module's mutants: their statuses, the diffs of those not killed, how they were run."""
    started = time.monotonic()
    if args.again:
        return recheck(mutmut, copy, module, tests, args)
    if not args.report_only:
        scratch_copy(copy, [module], tests, args.keyword)
        names = args.mutants or []
        run = subprocess.run(
            [str(mutmut), "run", "--max-children", str(args.max_children), *names],
            cwd=copy,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            sys.exit(
                f"mutmut run failed on {module} ({run.returncode}):\n"
                f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
            )
    statuses = results(mutmut, copy)
    ran = {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "minutes": round((time.monotonic() - started) / 60, 1),
        "max_children": args.max_children,
    }
    if args.report_only:  # the run is the last one in the scratch copy: its results' time
        ran = {k: load_store().get(module, {}).get(k, v) for k, v in ran.items()}
        metas = list((copy / "mutants").rglob("*.meta"))
        if metas:
            ended = datetime.fromtimestamp(max(m.stat().st_mtime for m in metas), UTC)
            ran["date"] = f"{ended:%Y-%m-%d %H:%M} UTC"
    return {
        **ran,
        "tests": tests + ([f"-k {args.keyword!r}"] if args.keyword else []),
        "mutants": args.mutants or ["*"],
        "statuses": statuses,
        "diffs": {
            n: show(mutmut, copy, n)
            for n, st in statuses.items()
            if st not in ("killed", "not checked")
        },
    }


def load_store() -> dict[str, dict[str, Any]]:
    return json.loads(STORE.read_text()) if STORE.exists() else {}


def all_statuses(store: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {n: st for run in store.values() for n, st in run["statuses"].items()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: pyproject's)")
    parser.add_argument("--tests", nargs="+", help="test paths (default: pyproject's)")
    parser.add_argument(
        "--mutants",
        nargs="+",
        help="only the mutants whose names match these globs (the rest stay 'not checked')",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="run only the module's last survivors again, with the tests as they are now",
    )
    parser.add_argument("-k", dest="keyword", help="pytest's -k: run only the tests it selects")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report from the last run's data"
    )
    parser.add_argument(
        "--work-dir", default=os.path.join(tempfile.gettempdir(), "phalanx-mutation")
    )
    return parser.parse_args()


def install_mutmut(venv: Path) -> Path:
    mutmut = venv / "bin" / "mutmut"
    if not mutmut.exists():
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True
        )
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", MUTMUT]
        subprocess.run(pip, check=True)
    return mutmut


def scratch_copy(copy: Path, modules: list[str], tests: list[str], keyword: str | None) -> Path:
    """src/, tests/ and pyproject.toml, with [tool.mutmut] narrowed to ``modules``/``tests``."""
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for tree in ("src", "tests"):
        shutil.copytree(REPO / tree, copy / tree, ignore=ignore)
    (copy / "pyproject.toml").write_text(scratch_pyproject(modules, tests, keyword))
    return copy


def scratch_pyproject(modules: list[str], tests: list[str], keyword: str | None) -> str:
    text = (REPO / "pyproject.toml").read_text()
    section = "\n".join(
        [
            "[tool.mutmut]",
            'source_paths = ["src/"]',
            f"only_mutate = {modules!r}".replace("'", '"'),
            f"pytest_add_cli_args_test_selection = {tests!r}".replace("'", '"'),
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"'
            + (f", {json.dumps('-k')}, {json.dumps(keyword)}]" if keyword else "]"),
            "",
        ]
    )
    text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", lambda _: section, text)
    return text


def recheck(
    mutmut: Path, copy: Path, module: str, tests: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """``--again``: each of the module's last survivors against its ``*_mutants.py`` tests as
    they are now (the tests written to kill them), in mutmut's tree of the last run. mutmut
    itself cannot: a changed test selection resets every result it has."""
    run = load_store()[module]
    tree = copy / "mutants"
    shutil.copytree(REPO / "tests", tree / "tests", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    killers = [t for t in tests if t.endswith("_mutants.py")]
    python = mutmut.parent / "python"
    keyword = ["-k", args.keyword] if args.keyword else []
    statuses = dict(run["statuses"])
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *keyword]
    clean = {**os.environ, "PYTHONPATH": "src", "MUTANT_UNDER_TEST": "none"}  # no mutant
    if subprocess.run([*command, *killers], cwd=tree, env=clean, capture_output=True).returncode:
        sys.exit(f"{module}: {' '.join(killers)} fail without a mutant: fix them first")
    for name in survivors(module):
        env = {**os.environ, "PYTHONPATH": "src", "MUTANT_UNDER_TEST": name}
        try:
            done = subprocess.run([*command, *killers], cwd=tree, env=env, capture_output=True,
                                  timeout=300)  # fmt: skip
            statuses[name] = "survived" if done.returncode == 0 else "killed"
        except subprocess.TimeoutExpired:
            statuses[name] = "timeout"
        print(f"  {name}: {statuses[name]}", flush=True)
    diffs = {n: d for n, d in run["diffs"].items() if statuses[n] != "killed"}
    return {**run, "statuses": statuses, "diffs": diffs, "rechecked_with": killers}


def survivors(module: str) -> list[str]:
    """The module's mutants that no test killed (or ran) and ``EQUIVALENT`` does not explain."""
    statuses = load_store().get(module, {}).get("statuses", {})
    left = ("survived", "no tests")
    return [n for n, st in statuses.items() if st in left and n not in EQUIVALENT]


def results(mutmut: Path, copy: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(mutmut), "results", "--all", "true"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            found[name] = status
    return found


def show(mutmut: Path, copy: Path, name: str) -> str:
    done = subprocess.run([str(mutmut), "show", name], cwd=copy, capture_output=True, text=True)
    return done.stdout.strip()


def module_of(name: str) -> str:
    return name.split(".x\u01c1")[0].split("__mutmut_")[0].rsplit(".x_", 1)[0]


def score_line(statuses: dict[str, str]) -> str:
    counts = Counter(statuses.values())
    plain = Counter(st for name, st in statuses.items() if name not in EQUIVALENT)
    judged = sum(plain.values()) - plain["no tests"] - plain["not checked"]
    killed = counts["killed"] + counts["timeout"]
    percent = 100 * killed / judged if judged else 0.0
    return f"{killed} of {judged} non-equivalent mutants killed ({percent:.0f} %)"


def _run_notes(run: dict[str, Any]) -> str:
    notes = ""
    skipped = [n for n in NOT_RUN if n in run["statuses"]]
    if skipped:
        notes += f"; all mutants but the {len(skipped)} in `NOT_RUN`"
    elif run.get("mutants", ["*"]) != ["*"]:
        notes += f"; only the mutants {', '.join(f'`{m}`' for m in run['mutants'])}"
    if run.get("rechecked_with"):
        notes += "; survivors run again with " + ", ".join(f"`{t}`" for t in run["rechecked_with"])
    return notes


def render(
    store: dict[str, dict[str, Any]], configured: list[str], args: argparse.Namespace
) -> str:
    statuses = all_statuses(store)
    not_run = [m for m in configured if m not in store]
    lines = [
        "# Mutation testing: the data-contract modules",
        "",
        f"{MUTMUT}, {os.cpu_count()} cores, each module run on its own with the tests listed "
        "(`python bench/mutation.py MODULE`; the module's tests are `MODULE_TESTS` in "
        "`bench/mutation.py`). Each module's last run is in `bench/results/mutation.json`.",
        "",
        "Not run yet (the score covers the modules below only): "
        + (", ".join(f"`{m}`" for m in not_run) or "none")
        + ".",
        "",
        f"**Score: {score_line(statuses)}.**",
        "",
        "A timeout (the mutant never ends; mutmut stops the tests) counts as killed; the mutants "
        "marked equivalent in `bench/mutation.py` are left out of the score.",
        "",
        "Known limit: mutmut runs, for each mutant, the tests it saw calling the mutated function "
        "while it collected its stats; a function that runs only on a background thread (the "
        "lease heartbeat, `Lease._renew`) can be linked to other tests than those that check it, "
        "or to none (`no tests`).",
        "",
        "Mutants never run (`NOT_RUN` in `bench/mutation.py`, shown as `not checked`): three "
        "of `local_store.py` hand `None` to `move_tree_contents`, whose `os.scandir(None)` moves "
        "the working directory's entries (mutmut's own tree) into the checkpoint; the first "
        "runs of that module ended there. One of `run_storage.py` puts every run at "
        "`/<name>`, outside the test's storage.",
        "",
        "| module | mutants | killed | survived | equivalent | no tests | other | score | run |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for module, run in sorted(store.items()):
        counts = Counter(run["statuses"].values())
        equivalent = sum(1 for n in run["statuses"] if n in EQUIVALENT)
        # an equivalent mutant is counted once, as equivalent, whether it survived or had no tests
        plain = Counter(st for n, st in run["statuses"].items() if n not in EQUIVALENT)
        other = sum(counts.values()) - sum(counts[s] for s in ("killed", "survived", "no tests"))
        lines.append(
            f"| `{module}` | {sum(counts.values())} | {counts['killed']} | "
            f"{plain['survived']} | {equivalent} | {plain['no tests']} | {other} | "
            f"{score_line(run['statuses']).split('(')[-1].rstrip(')')} | {run['date']}, "
            f"{run['minutes']:.0f} min, tests {', '.join(f'`{t}`' for t in run['tests'])}"
            f"{_run_notes(run)} |"
        )
    lines += ["", "## Not killed", ""]
    for run in store.values():
        for name, diff in sorted(run["diffs"].items()):
            reason = EQUIVALENT.get(name)
            status = f"equivalent: {reason}" if reason else run["statuses"][name]
            lines += [f"### `{name}` ({status})", "", "```diff", diff, "```", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
