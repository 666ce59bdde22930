"""The non-editable install ships every package (issue 24 item 5): pyproject lists its packages by name, so a
new sub-package (`ardiff.worker.tiny`, `ardiff.worker.families`) missing from the list would be left out of
the images, which install `.[worker]` / `.[operator]` without the checkout."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    assert found == set(setuptools["packages"])


def test_license_is_an_spdx_expression() -> None:
    """setuptools deprecates `license = {text = ...}` (its builds warn, and stop being supported after
    2027-02-18): the images' non-editable install builds the package, so it must stay buildable. An SPDX
    string needs setuptools >= 77, which the build system must then require."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in pyproject["build-system"]["requires"]
