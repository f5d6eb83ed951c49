"""The documentation site builds with ``mkdocs build --strict`` (no broken link, no missing
anchor, no unresolved reference) and its API reference documents every name in every public
module's ``__all__``, each under its own anchor (``phalanx.torch.TorchTrainer``), from its
docstring.

.ci/run builds the site once, before pytest, and passes its directory in PHALANX_DOCS_SITE;
without it (a single test run) the site is built here, into a temporary directory.
"""

from __future__ import annotations

import ast
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


def _exported(module: str) -> list[str]:
    """The module's ``__all__``, read from its source: importing phalanx.tensorflow.keras would
    start TensorFlow (seconds, and it sets environment variables in this process)."""
    path = ROOT / "src" / module.replace(".", "/")
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


def _anchors(site: Path) -> set[str]:
    found: set[str] = set()
    for page in (site / "reference").rglob("index.html"):
        found.update(re.findall(r'id="(phalanx[\w.]*)"', page.read_text()))
    return found


@pytest.mark.parametrize("module", ["phalanx", *sorted(PUBLIC_MODULES)])
def test_every_public_name_is_in_the_reference(site, module):
    exported = _exported(module)
    anchors = _anchors(site)
    assert f"{module}" in anchors, f"{module} has no page section: add `::: {module}`"
    missing = [name for name in exported if f"{module}.{name}" not in anchors]
    assert missing == [], f"{module}: not in the API reference (docs/reference/)"


def test_every_page_is_in_the_navigation_and_built(site):
    import yaml

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    listed = set(re.findall(r"[\w/.-]+\.md", str(config["nav"])))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert sorted(listed - pages) == [], "mkdocs.yml's nav names pages that do not exist"
    assert sorted(pages - listed) == [], "pages a reader cannot reach: add them to mkdocs.yml's nav"
    for page in listed:
        assert (site / page.removesuffix(".md").removesuffix("index") / "index.html").exists()


def test_every_public_class_and_function_has_a_docstring_with_an_example():
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")])
    package = loader.load("phalanx")
    loader.resolve_aliases(implicit=False, external=False)
    undocumented, without_example = set(), set()
    for module in ["phalanx", *sorted(PUBLIC_MODULES)]:
        found = package[module.removeprefix("phalanx.")] if module != "phalanx" else package
        for name in _exported(module):
            obj = found[name]
            obj = obj.final_target if obj.is_alias else obj
            if obj.kind.value not in ("class", "function"):
                continue
            doc = obj.docstring.value if obj.docstring else ""
            if not doc:
                undocumented.add(obj.path)
            # An error is raised by phalanx, not built by the user: its message is its example.
            elif "Example" not in doc and not name.endswith("Error"):
                without_example.add(obj.path)
    assert sorted(undocumented) == [], "public names without a docstring"
    assert sorted(without_example) == [], "docstrings without an `Example::` section"
