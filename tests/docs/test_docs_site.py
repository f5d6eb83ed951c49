"""The documentation site builds with ``mkdocs build --strict`` (no broken link, no missing
anchor, no unresolved reference) and its API reference documents every name in every public
module's ``__all__``, each under its own anchor (``phalanx.torch.TorchTrainer``), from its
docstring.

.ci/run builds the site once, before pytest, and passes its directory in PHALANX_DOCS_SITE;
without it (a single test run) the site is built here, into a temporary directory.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers.doc_blocks import ROOT

pytestmark = pytest.mark.slow

# Every public module: the packages, and the modules test_api.py keeps public.
sys.path.insert(0, str(ROOT / "tests"))
from test_api import PUBLIC_MODULES  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    built = os.environ.get("PHALANX_DOCS_SITE")
    if built and (Path(built) / "index.html").exists():
        return Path(built)
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(target)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    return target


def _anchors(site: Path) -> set[str]:
    found: set[str] = set()
    for page in (site / "reference").rglob("index.html"):
        found.update(re.findall(r'id="(phalanx[\w.]*)"', page.read_text()))
    return found


@pytest.mark.parametrize("module", ["phalanx", *sorted(PUBLIC_MODULES)])
def test_every_public_name_is_in_the_reference(site, module):
    exported = getattr(importlib.import_module(module), "__all__", [])
    anchors = _anchors(site)
    assert f"{module}" in anchors, f"{module} has no page section: add `::: {module}`"
    missing = [name for name in exported if f"{module}.{name}" not in anchors]
    assert missing == [], f"{module}: not in the API reference (docs/reference/)"


def test_the_site_has_every_guide_in_its_navigation(site):
    import yaml

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    listed = set(re.findall(r"[\w/.-]+\.md", str(config["nav"])))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert listed - pages == set(), "nav names pages that do not exist"
    ours = {p for p in pages if not p.startswith("guides/") or p.count("/") > 1 or p in listed}
    assert ours <= listed | {p for p in pages if p.startswith("guides/")}
    for page in listed:
        assert (site / page.removesuffix(".md").removesuffix("index")).exists(), page
