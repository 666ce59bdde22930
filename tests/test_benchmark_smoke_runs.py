"""Every benchmark script has a smoke run in the suite (issue 42: `continuity.py` broke and nothing ran it):
each script of benchmarks/ is imported by a test (`benchmark_module("<name>")`) or run by one (its path), or
is run by a benchmark that is (a helper script such as `picker_load.py`, which needs the gateway's venv)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def smoked(tests: str, benchmarks: dict[str, str]) -> set[str]:
    """The benchmarks `tests` (the suite's source) import or run, and those that these run in turn."""
    covered = {n for n in benchmarks if f'benchmark_module("{n}")' in tests or f"benchmarks/{n}.py" in tests}
    while more := {n for n in benchmarks for m in covered if f'"{n}.py"' in benchmarks[m]} - covered:
        covered |= more
    return covered


def test_every_benchmark_script_is_imported_or_run_by_a_test() -> None:
    tests = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("*.py"))
    benchmarks = {path.stem: path.read_text() for path in (ROOT / "benchmarks").glob("*.py")}
    scripts = {name for name, text in benchmarks.items() if 'if __name__ == "__main__":' in text}
    assert {"soak", "cold_start", "e2e", "picker_load"} <= scripts
    assert sorted(scripts - smoked(tests, benchmarks)) == []


def test_a_script_no_test_imports_or_runs_is_told() -> None:
    benchmarks = {"a": "main()", "b": 'run("c.py")', "c": "main()", "d": "main()"}
    assert smoked('benchmark_module("b")', benchmarks) == {"b", "c"}
    assert smoked("python benchmarks/d.py --smoke", benchmarks) == {"d"}
