"""Product code stands alone (issue 11 item 9): nothing the distribution ships imports the dev harness, which
is in no distribution or image (issue 41 item 6); the layers import only downwards (issue 24 item 7): kv
nothing of ours but the shared base, the base nothing but itself, the worker and the operator neither the
harness nor the user-facing tools.

Every module is parsed (not imported: the worker's need torch) and each `import`/`from ... import`, relative
ones resolved against the module's package, is checked against the harness's packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ardiff.devcluster.images import DEV_HARNESS_DIRS

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = {"operator": "ardiff.operator", "worker": "ardiff.worker", "kv": "ardiff.kv"}
# The harness's packages, from its folders as the images' build context leaves them out.
HARNESS = tuple(folder.replace("/", ".") for folder in DEV_HARNESS_DIRS)


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
    return any(module == harness or module.startswith(harness + ".") for harness in HARNESS)


# The layers of ours (issue 24 item 7; a drawing tool cannot follow `ardiff.kv` to `kv/`, hence this scan):
# the shared base (the modules directly in ardiff/ but the user-facing tools), kv, the worker, the operator,
# the dev harness, and the user-facing tools (the CLI, the client, its player, the viewer), which may import
# the product.
TOOLS = frozenset({"cli", "client", "client_cli", "player", "viewer"})
# What no module of a layer imports. kv imports nothing of ours but the base; the worker and the operator
# import kv and the base, and never each other (test_the_operator_and_the_worker_never_import_each_other).
FORBIDDEN = {
    "base": {"kv", "worker", "operator", "harness", "tools"},
    "kv": {"worker", "operator", "harness", "tools"},
    "worker": {"harness", "tools"},
    "operator": {"harness", "tools"},
}


def layer(module: str) -> str | None:
    """The layer of an absolute module name; None for anything not ours."""
    parts = module.split(".")
    if parts[0] != "ardiff":
        return None
    name = parts[1] if len(parts) > 1 else ""
    if name in PRODUCT:
        return name
    if f"ardiff.{name}" in HARNESS:
        return "harness"
    return "tools" if name in TOOLS else "base"


def layer_modules(name: str) -> list[tuple[Path, str]]:
    """(path, package) of every module of the layer `name` (the base: ardiff/*.py but the tools)."""
    if name == "base":
        return [(path, "ardiff") for path in sorted((ROOT / "ardiff").glob("*.py")) if path.stem not in TOOLS]
    folder = ROOT / name
    return [
        (path, ".".join([PRODUCT[name], *path.relative_to(folder).parent.parts]))
        for path in sorted(folder.rglob("*.py"))
    ]


def test_layers_are_told_apart():
    names = {
        "ardiff": "base",
        "ardiff.errors": "base",
        "ardiff.wire": "base",
        "ardiff.__version__": "base",
        "ardiff.kv.records": "kv",
        "ardiff.worker": "worker",
        "ardiff.operator.specs": "operator",
        "ardiff.devcluster.kubelet": "harness",
        "ardiff.tiny_world.train": "harness",
        "ardiff.client": "tools",
        "ardiff.viewer": "tools",
        "redis": None,
    }
    assert {module: layer(module) for module in names} == names


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_each_layer_imports_only_what_is_below_it(name):
    modules = layer_modules(name)
    assert modules, f"no modules in the layer {name}"
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module} ({layer(module)})"
        for path, package in modules
        for line, module in imported_modules(path, package)
        if layer(module) in FORBIDDEN[name]
    ]
    assert offenders == []


def test_the_scan_sees_every_import_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import ardiff.devcluster.kubelet\n"
        "from ardiff.devcluster.redis_server import free_port\n"
        "from ardiff import devcluster\n"
        "from .. import devcluster as dc\n"
        "def f():\n    from ..devcluster import cli\n"
        "import ardiff.worker.net\n"
        "from ardiff.tiny_world import world\n"
    )
    hits = [line for line, module in imported_modules(sample, "ardiff.worker") if _is_harness(module)]
    assert sorted(set(hits)) == [1, 2, 3, 4, 6, 8]


def shipped_modules(folder: str) -> list[tuple[Path, str]]:
    """(path, package) of every module under `folder` that the distribution ships (not the harness's)."""
    root = ROOT / folder
    package = PRODUCT.get(folder, "ardiff")
    found = []
    for path in sorted(root.rglob("*.py")):
        module_package = ".".join([package, *path.relative_to(root).parent.parts])
        if not _is_harness(module_package):
            found.append((path, module_package))
    return found


@pytest.mark.parametrize("folder", [*sorted(PRODUCT), "ardiff"])
def test_nothing_shipped_imports_the_dev_harness(folder):
    """The CLI loads the harness's commands by name, only where the harness is present (`ardiff.cli`)."""
    modules = shipped_modules(folder)
    assert modules, f"no modules under {folder}/"
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path, package in modules
        for line, module in imported_modules(path, package)
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
