"""`ardiff kv plan` / `ardiff kv explain` as a user runs them: a real process, real output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ardiff.kv.presets import DEFAULT_PRESETS

ARDIFF = [sys.executable, "-m", "ardiff.cli"]


def ardiff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ARDIFF, *args], capture_output=True, text=True, timeout=60, check=False)


def test_plan_table_defaults() -> None:
    result = ardiff("kv", "plan")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines[0].split()
    assert header[:3] == ["preset", "GPU", "fraction"]
    assert header[-3:] == ["sessions", "binding", "limit"]
    rows = [line.split() for line in lines[2:] if line.startswith(DEFAULT_PRESETS)]
    assert len(rows) == len(DEFAULT_PRESETS) * 2 * 3  # presets x (80, 141 GiB) x (0.5, 0.6, 0.9)
    by_key = {(row[0], row[1], row[3]): row for row in rows}
    # LingBot-World at 480x832 on one H200: two sessions at 0.9 (the pipeline's cap), one at 0.6.
    h200 = by_key[("lingbot-world-480x832", "141", "0.9")]
    assert h200[4:6] == ["45.36", "GiB"]  # weights
    assert h200[8:10] == ["85.18", "GiB"]  # KV budget
    assert h200[10:12] == ["1.19", "GiB"]  # bytes per page
    assert h200[12:14] == ["18", "3"]  # pages per session, scratch pages
    assert h200[-2:] == ["2", "pipeline_session_capacity"]
    assert by_key[("lingbot-world-480x832", "141", "0.6")][-2:] == ["1", "kv_budget"]
    # ... and not even one session on an 80 GiB GPU without sequence parallelism.
    h100 = " ".join(by_key[("lingbot-world-480x832", "80", "0.9")])
    assert "0 does not fit: needs 38.75 GiB, 33.64 GiB free" in h100
    assert by_key[("lingbot-world-480x832-sp4", "80", "0.9")][-2:] == ["2", "pipeline_session_capacity"]
    assert by_key[("dreamzero-droid", "141", "0.9")][-2:] == ["5", "kv_budget"]
    assert by_key[("dreamzero-droid-cfg2", "141", "0.9")][-2:] == ["10", "kv_budget"]
    assert "A running pod's capacity is what its runner reports after load" in result.stdout


def test_plan_json_in_bytes() -> None:
    result = ardiff(
        "kv", "plan", "--preset", "tiny-lingbot-64x64", "dreamzero-droid",
        "--gpu-memory-gib", "8", "--fraction", "0.1", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    tiny, dreamzero = json.loads(result.stdout)
    assert tiny == {
        "preset": "tiny-lingbot-64x64",
        "gpu_memory_bytes": 8 << 30,
        "fraction": 0.1,
        "weights_bytes": 0,
        "runtime_overhead_bytes": 0,
        "page_bytes": 16_384,  # 2 layers x 2 heads x 16 tokens x 2 x 32 x 4 B
        "pages_per_session": 9,  # sink 3 + window 6
        "scratch_pages": 3,
        "cross_attention_bytes_per_session": 524_288,  # 2 x 512 tokens x 2 heads x 32 x 4 B x 2 layers
        "model_owned_bytes_per_session": 40_918_016,
        "one_session_bytes": 41_720_832,
        "available_bytes": 8 << 30,
        "kv_budget_bytes": 858_993_459,
        "managed_blocks": 47_366,
        "sessions": 2,
        "binding_limit": "pipeline_session_capacity",
    }
    assert (dreamzero["sessions"], dreamzero["binding_limit"], dreamzero["kv_budget_bytes"]) == (
        0,
        "kv_does_not_fit",
        None,
    )


def test_plan_applies_the_pool_cap() -> None:
    result = ardiff(
        "kv", "plan", "--preset", "dreamzero-droid", "--gpu-memory-gib", "141", "--fraction", "0.9",
        "--session-capacity", "3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2].split()[-2:] == ["3", "pool_session_capacity"]


def test_explain() -> None:
    result = ardiff("kv", "explain", "dreamzero-droid", "--gpu-memory-gib", "141", "--fraction", "0.9")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "model: dreamzero-droid (DreamZero-DROID, 3 x 176x320 views, bfloat16, one GPU)"
    assert "page (K and V of one frame, all layers): 720,896,000 B (687.50 MiB)" in lines
    assert "capacity: 5 of 64 requested, limited by the KV budget (R(6) = 91.14 GiB > 87.57 GiB)" in lines
    assert lines[-1] == "sessions per pod: 5 (binding limit: kv_budget)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["kv", "plan", "--fraction", "1.5"], "argument --fraction: fraction must be in (0, 1], got '1.5'"),
        (["kv", "plan", "--fraction", "abc"], "argument --fraction: fraction must be in (0, 1], got 'abc'"),
        (
            ["kv", "plan", "--gpu-memory-gib", "-80"],
            "argument --gpu-memory-gib: GPU memory must be a positive",
        ),
        (["kv", "plan", "--preset", "lingbot-1080p"], "argument --preset: invalid choice: 'lingbot-1080p'"),
        (["kv", "plan", "--session-capacity", "0"], "session capacity must be a positive integer, got '0'"),
        (["kv", "explain", "dreamzero-droid", "--fraction", "0.9"], "the following arguments are required"),
        (["kv"], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_arguments_print_an_error_without_traceback(args: list[str], message: str) -> None:
    result = ardiff(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "error:" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_explain_when_nothing_fits_is_an_error_without_traceback() -> None:
    result = ardiff("kv", "explain", "lingbot-world-480x832", "--gpu-memory-gib", "80", "--fraction", "0.9")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "error: kv_does_not_fit: lingbot-world-480x832 on a 80.00 GiB device (weights 45.36 GiB, "
        "runtime overhead 1.00 GiB): one session needs 41,612,166,400 bytes (38.75 GiB) but "
        "36,121,332,634 bytes (33.64 GiB) are available"
    )
    assert "Traceback" not in result.stderr
