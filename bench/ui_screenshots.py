"""Refresh the run viewer's screenshots in docs/images/ from the browser tests.

Runs tests/ui/test_browser.py (each test screenshots its page under its tmp dir) with a known
--basetemp and copies the pictures to docs/images/ui-<page>.png.

    python bench/ui_screenshots.py
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = {
    "test_list_shows_the_runs": "ui-runs.png",
    "test_run_page_draws_its_charts_and_names_its_metrics": "ui-run.png",
    "test_failed_run_shows_its_traceback": "ui-failed.png",
    "test_compare_overlays_two_runs": "ui-compare.png",
    "test_a_live_runs_new_step_appears_without_a_reload": "ui-live.png",
}


def main() -> int:
    base = tempfile.mkdtemp(prefix="phalanx-ui-shots-")
    try:
        test = os.path.join(ROOT, "tests", "ui", "test_browser.py")
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test]
        code = subprocess.call([*args, f"--basetemp={base}"], cwd=ROOT)
        if code:
            return code
        images = os.path.join(ROOT, "docs", "images")
        os.makedirs(images, exist_ok=True)
        for test_name, image in PAGES.items():
            found = glob.glob(os.path.join(base, "**", f"{test_name}.png"), recursive=True)
            if not found:
                print(f"no screenshot from {test_name}", file=sys.stderr)
                return 1
            shutil.copy(found[0], os.path.join(images, image))
            print(f"wrote docs/images/{image}")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
