"""The non-editable install ships every package but the dev harness's (issue 24 item 5, issue 41 item 6):
pyproject lists its packages by name, so a new sub-package (`ardiff.worker.tiny`, `ardiff.worker.families`)
missing from the list would be left out of the images, which install `.[worker]` / `.[operator]` without the
checkout; the dev harness (`ardiff.devcluster`, `ardiff.tiny_world`) runs from a checkout, ships nowhere."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from ardiff.devcluster.images import DEV_HARNESS_DIRS

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_but_the_harness_is_listed() -> None:
    """Every folder with an `__init__.py` is listed, and so is every data folder (a package-data key); the
    harness's folders (the ones the images' build context leaves out) are not."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    harness = {folder.replace("/", ".") for folder in DEV_HARNESS_DIRS}
    assert harness <= found
    assert (found - harness) | set(setuptools["package-data"]) == set(setuptools["packages"])


def test_a_build_warns_of_nothing_and_ships_the_data(tmp_path: Path) -> None:
    """A fresh install builds the package: setuptools warned (~70 lines) of each data folder it was not told
    of (`ardiff.kv.lua`, `ardiff.worker.models`: "Package would be ignored"). The wheel still carries them."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "ardiff", "kv", "operator", "worker"):
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
    built = subprocess.run(
        [*wheel, "-w", tmp_path, "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output[-3000:]
    assert "Warning" not in output, output[-3000:]
    (built_wheel,) = tmp_path.glob("ardiff-*.whl")
    names = set(zipfile.ZipFile(built_wheel).namelist())
    assert "ardiff/kv/lua/place.lua" in names
    assert "ardiff/worker/models/tiny-world-trained/model_index.json" in names
    # Built from a whole checkout, harness included: the wheel still leaves it out.
    assert (source / "ardiff" / "devcluster" / "cluster.py").exists()
    assert [name for name in names if name.startswith(tuple(f"{d}/" for d in DEV_HARNESS_DIRS))] == []
    assert "ardiff/worker/tiny/model.py" in names  # the embedded tiny models ship


def test_license_is_an_spdx_expression() -> None:
    """setuptools deprecates `license = {text = ...}` (its builds warn, and stop being supported after
    2027-02-18): the images' non-editable install builds the package, so it must stay buildable. An SPDX
    string needs setuptools >= 77, which the build system must then require."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in pyproject["build-system"]["requires"]
