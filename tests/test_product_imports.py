"""Product code stands alone (issue 11 item 9): `operator/`, `worker/` and `kv/` never import the dev harness.

Every module is parsed (not imported: the worker's need torch) and each `import`/`from ... import`, relative
ones resolved against the module's package, is checked against `ardiff.devcluster`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = {"operator": "ardiff.operator", "worker": "ardiff.worker", "kv": "ardiff.kv"}
HARNESS = "ardiff.devcluster"


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in `path`, a module of `package`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = package.split(".")  # the folders are flat: every module's package is `package`
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from ardiff import devcluster` names the harness in the alias
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def _is_harness(module: str) -> bool:
    return module == HARNESS or module.startswith(HARNESS + ".")


def test_the_scan_sees_every_import_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import ardiff.devcluster.kubelet\n"
        "from ardiff.devcluster.redis_server import free_port\n"
        "from ardiff import devcluster\n"
        "from .. import devcluster as dc\n"
        "def f():\n    from ..devcluster import cli\n"
        "import ardiff.worker.net\n"
    )
    hits = [line for line, module in imported_modules(sample, "ardiff.worker") if _is_harness(module)]
    assert sorted(set(hits)) == [1, 2, 3, 4, 6]


@pytest.mark.parametrize("folder", sorted(PRODUCT))
def test_product_code_never_imports_the_dev_harness(folder):
    modules = sorted((ROOT / folder).rglob("*.py"))
    assert modules, f"no modules under {folder}/"
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in modules
        for line, module in imported_modules(path, PRODUCT[folder])
        if _is_harness(module)
    ]
    assert offenders == []


# The operator and the worker never import each other (issue 24 item 5): what both need is in the base.
APART = [("operator", "ardiff.worker"), ("worker", "ardiff.operator")]


@pytest.mark.parametrize(("folder", "other"), APART, ids=[f"{f}-not-{o}" for f, o in APART])
def test_the_operator_and_the_worker_never_import_each_other(folder, other):
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, module in imported_modules(path, PRODUCT[folder])
        if module == other or module.startswith(other + ".")
    ]
    assert offenders == []
