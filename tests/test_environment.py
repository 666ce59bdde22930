"""Facts about the installed environment that the rest of the suite relies on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


TORCHVISION_PROBE = """
import torch, torchaudio, torchcodec, torchvision
from torchvision.ops import nms
from torchvision.transforms import v2
boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
print(torch.__version__, torchvision.__version__, nms(boxes, torch.tensor([0.9, 0.8]), 0.5).tolist(),
      tuple(v2.Resize((4, 4))(torch.zeros(3, 8, 8)).shape))
"""


def test_the_torchvision_family_loads_beside_torch_as_pypi_ships_them() -> None:
    """PyPI's torch is a CUDA build now (no CPU wheel): vllm's pinned torchvision, torchaudio and
    torchcodec load and run beside it with or without a GPU, so nothing removes or stubs them any more."""
    probe = [sys.executable, "-c", TORCHVISION_PROBE]
    out = subprocess.run(probe, capture_output=True, text=True, check=True)
    torch_version, vision_version, kept, shape = out.stdout.split(" ", 3)
    assert torch_version.split("+")[0] == "2.13.0"
    assert vision_version.split("+")[0] == "0.28.0"
    assert (kept, shape.strip()) == ("[0]", "(3, 4, 4)")


def test_operator_import_name_does_not_shadow_stdlib() -> None:
    code = "import operator, ardiff.operator; print(operator.__file__); print(ardiff.operator.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    stdlib_operator, ours = out.stdout.split()
    assert Path(stdlib_operator).name == "operator.py"
    assert Path(ours) == ROOT / "operator" / "__init__.py"


def test_ardiff_cli_reports_usage_errors_without_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ardiff.cli", "no-such-command"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "invalid choice" in out.stderr
    assert "Traceback" not in out.stderr
