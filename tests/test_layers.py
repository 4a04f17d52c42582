"""The layer rules in pyproject.toml ([tool.importlinter]) hold, and they do bite: a copy of the
package with one forbidden import breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT = str(Path(sys.executable).parent / "lint-imports")


def lint(src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT, "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_components_and_shared_layers_keep_their_rules() -> None:
    res = lint(REPO / "src")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 3 kept, 0 broken." in res.stdout


def test_a_component_importing_another_breaks_the_rules(tmp_path: Path) -> None:
    shutil.copytree(REPO / "src" / "topolvm", tmp_path / "topolvm")
    extender = tmp_path / "topolvm" / "scheduler" / "extender.py"
    extender.write_text(extender.read_text() + "\nimport topolvm.node.reconciler  # noqa\n")
    res = lint(tmp_path)
    assert res.returncode != 0
    assert "components do not import each other" in res.stdout and "BROKEN" in res.stdout
    assert "topolvm.scheduler.extender -> topolvm.node.reconciler" in res.stdout


def test_a_shared_layer_importing_a_component_breaks_the_rules(tmp_path: Path) -> None:
    shutil.copytree(REPO / "src" / "topolvm", tmp_path / "topolvm")
    api = tmp_path / "topolvm" / "k8s" / "api.py"
    api.write_text(api.read_text() + "\nimport topolvm.lvmd.capacity  # noqa\n")
    res = lint(tmp_path)
    assert res.returncode != 0
    assert "shared layers do not import components BROKEN" in res.stdout


def test_an_import_cycle_inside_a_component_breaks_the_rules(tmp_path: Path) -> None:
    """Also an import only for type checking: the server imports the status module."""
    shutil.copytree(REPO / "src" / "topolvm", tmp_path / "topolvm")
    status = tmp_path / "topolvm" / "scheduler" / "status.py"
    status.write_text(
        status.read_text()
        + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        + "    import topolvm.scheduler.server  # noqa\n"
    )
    res = lint(tmp_path)
    assert res.returncode != 0
    assert "no import cycles among the modules of a package" in res.stdout
    assert "No cycles are allowed in topolvm.scheduler" in res.stdout


def test_every_imported_package_is_declared() -> None:
    """Each third-party module that src/ imports belongs to a distribution named in
    [project.dependencies] (not merely installed because another package needs it)."""
    import ast
    import importlib.metadata as md
    import re
    import tomllib

    declared = {
        re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-")
        for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    owners = md.packages_distributions()
    missing = {}
    for path in (REPO / "src").rglob("*.py"):
        if "_pb2" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in sys.stdlib_module_names or top == "topolvm":
                    continue
                dists = {d.lower().replace("_", "-") for d in owners.get(top, [])}
                if not dists & declared:
                    missing[top] = str(path.relative_to(REPO))
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"
