"""Mutation testing of the data-contract modules: does the suite catch a bug put into them?

    python bench/mutation.py                      # every module in pyproject's [tool.mutmut]
    python bench/mutation.py src/phalanx/_internal/worker/metrics.py --tests tests/worker

mutmut (https://github.com/boxed/mutmut) makes one small change at a time (a mutant: ``<`` for
``<=``, a constant, a removed call) to the modules in ``[tool.mutmut] only_mutate`` and runs the
tests of ``pytest_add_cli_args_test_selection`` that cover the changed function; a mutant the
tests still pass on *survived*. It is slow (hours for every module on 2 cores), so it runs here,
not in CI, and works on a scratch copy of src/, tests/ and pyproject.toml (mutmut writes a
``mutants/`` tree next to the code). mutmut and its libcst are installed into a venv of their own
(``--system-site-packages``: phalanx and the test dependencies come from this environment),
so the project's pinned libcst is left alone.

The result, ``bench/results/mutation.md``: per module, killed / survived / not covered and the
score (killed over non-equivalent mutants), then every survivor with its diff. A survivor gets a
test that kills it, or an entry in ``EQUIVALENT`` below (no test can tell it apart: the one-line
reason says why). Not a comparative benchmark, so bench/harness.py is not used.
"""

from __future__ import annotations

import argparse
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

import tomllib

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "bench" / "results" / "mutation.md"
MUTMUT = "mutmut==3.8.1"

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
    "phalanx._internal.worker.metrics.x__convert__mutmut_49": (
        "zip(strict=False): items is built from value, so the lengths always agree"
    ),
}


def main() -> None:
    args = parse_args()
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    modules = args.modules or config["only_mutate"]
    tests = args.tests or config["pytest_add_cli_args_test_selection"]
    work = Path(args.work_dir)
    mutmut = install_mutmut(work / "venv")
    copy = work / "repo"
    started = time.monotonic()
    if not args.report_only:
        scratch_copy(copy, modules, tests)
        run = subprocess.run(
            [str(mutmut), "run", "--max-children", str(args.max_children)],
            cwd=copy,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
        )
    minutes = (time.monotonic() - started) / 60
    if not args.report_only and run.returncode != 0:
        sys.exit(
            f"mutmut run failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        )
    statuses = results(mutmut, copy)
    diffs = {
        name: show(mutmut, copy, name) for name, status in statuses.items() if status != "killed"
    }
    not_run = [m for m in config["only_mutate"] if m not in modules]
    RESULT.write_text(render(statuses, diffs, modules, not_run, tests, minutes, args))
    print(f"wrote {RESULT.relative_to(REPO)}: {score_line(statuses)}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: pyproject's)")
    parser.add_argument("--tests", nargs="+", help="test paths (default: pyproject's)")
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


def scratch_copy(copy: Path, modules: list[str], tests: list[str]) -> Path:
    """src/, tests/ and pyproject.toml, with [tool.mutmut] narrowed to ``modules``/``tests``."""
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for tree in ("src", "tests"):
        shutil.copytree(REPO / tree, copy / tree, ignore=ignore)
    text = (REPO / "pyproject.toml").read_text()
    section = "\n".join(
        [
            "[tool.mutmut]",
            'source_paths = ["src/"]',
            f"only_mutate = {modules!r}".replace("'", '"'),
            f"pytest_add_cli_args_test_selection = {tests!r}".replace("'", '"'),
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]',
            "",
        ]
    )
    text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", lambda _: section, text)
    (copy / "pyproject.toml").write_text(text)
    return copy


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
    equivalent = sum(1 for name in statuses if name in EQUIVALENT)
    judged = len(statuses) - equivalent - counts["no tests"] - counts["not checked"]
    killed = counts["killed"] + counts["timeout"]
    percent = 100 * killed / judged if judged else 0.0
    return f"{killed} of {judged} non-equivalent mutants killed ({percent:.0f} %)"


def render(
    statuses: dict[str, str],
    diffs: dict[str, str],
    modules: list[str],
    not_run: list[str],
    tests: list[str],
    minutes: float,
    args: argparse.Namespace,
) -> str:
    by_module: dict[str, Counter[str]] = {}
    for name, status in statuses.items():
        by_module.setdefault(module_of(name), Counter())[status] += 1
    lines = [
        "# Mutation testing: the data-contract modules",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {MUTMUT}, {minutes:.0f} min on "
        f"{os.cpu_count()} cores (`--max-children {args.max_children}`).",
        "",
        f"Command: `python bench/mutation.py {' '.join(args.modules)}"
        + (f" --tests {' '.join(args.tests)}`" if args.tests else "`"),
        "",
        f"Modules: {', '.join(f'`{m}`' for m in modules)}.",
        f"Tests: {', '.join(f'`{t}`' for t in tests)}.",
        "",
        "Not run this time (the score covers the modules above only): "
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
        "lease heartbeat, `Lease._renew`) can be linked to other tests than those that check it. "
        "Checked by hand on such survivors: the heartbeat loop that never runs is killed by "
        "`tests/storage/test_run_lease.py` run directly (the lease's score here is a lower bound).",
        "",
        "| module | mutants | killed | survived | no tests | other |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for module, counts in sorted(by_module.items()):
        other = sum(counts.values()) - sum(counts[s] for s in ("killed", "survived", "no tests"))
        lines.append(
            f"| `{module}` | {sum(counts.values())} | {counts['killed']} | "
            f"{counts['survived']} | {counts['no tests']} | {other} |"
        )
    lines += ["", "## Not killed", ""]
    for name, diff in sorted(diffs.items()):
        reason = EQUIVALENT.get(name)
        status = f"equivalent: {reason}" if reason else statuses[name]
        lines += [f"### `{name}` ({status})", "", "```diff", diff, "```", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
