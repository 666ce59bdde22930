"""The Gateway API's and the Gateway API Inference Extension's CRDs, from their upstream Go modules (issue
37): what a cluster that runs a GIE-conformant gateway has installed, for the tests that apply the chart's
`InferencePool` and `HTTPRoute` to the real API server. Never written by hand: `go mod download` fetches the
pinned module zips into Go's module cache (`~/go/pkg/mod`), which carry the YAML.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

GATEWAY_API = "sigs.k8s.io/gateway-api@v1.6.3"
INFERENCE_EXTENSION = "sigs.k8s.io/gateway-api-inference-extension@v1.6.2"
# The CRDs the chart's objects need, in each module.
_CRDS = {
    GATEWAY_API: ("config/crd/standard/gateway.networking.k8s.io_httproutes.yaml",),
    INFERENCE_EXTENSION: ("config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",),
}


def module_dir(module: str) -> Path:
    """The unpacked module in Go's module cache (downloaded on first use)."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", module], capture_output=True, text=True, check=False, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"go mod download {module} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return Path(json.loads(done.stdout)["Dir"])


def upstream_crds() -> list[dict[str, Any]]:
    """HTTPRoute (Gateway API, standard channel) and InferencePool (the inference extension) as upstream
    ships them."""
    documents: list[dict[str, Any]] = []
    for module, paths in _CRDS.items():
        directory = module_dir(module)
        for path in paths:
            documents += [doc for doc in yaml.safe_load_all((directory / path).read_text()) if doc]
    return documents
