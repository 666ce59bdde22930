"""charts/ardiff/README.md is generated from values.yaml and values.schema.json (tests/chart/readme.py)."""

from __future__ import annotations

import yaml

from tests.chart.readme import CHART, render


def test_the_chart_readme_is_generated_from_the_values_and_their_schema() -> None:
    assert (CHART / "README.md").read_text() == render(), "run: .venv/bin/python -m tests.chart.readme"


def test_every_value_has_a_row() -> None:
    def leaves(values: dict, prefix: str = "") -> list[str]:
        paths = []
        for key, value in values.items():
            path = f"{prefix}{key}"
            nested = isinstance(value, dict) and value and path != "defaultPool.spec"
            paths += leaves(value, f"{path}.") if nested else [path]
        return paths

    readme = render()
    for path in leaves(yaml.safe_load((CHART / "values.yaml").read_text())):
        assert f"| `{path}` |" in readme, path
