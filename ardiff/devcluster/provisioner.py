"""The dev cluster's volume provisioner: PersistentVolumeClaims of its StorageClass become `hostPath`
PersistentVolumes under one directory (what rancher's local-path provisioner does, in a few lines).

`python -m ardiff.devcluster.provisioner KUBECONFIG ROOT` (the admin's kubeconfig): every second, each claim
of the class `ardiff-local` (the cluster's default class) that waits for a volume gets one, sized as it asks,
with its access modes (ReadWriteMany included: every node is this machine), `<ROOT>/<namespace>/<claim>-<uid>`
as its path and the claim in its `claimRef`; the controller-manager's PersistentVolume controller then binds
them, as it binds any provisioned volume. A `Released` volume of ours (its claim deleted; reclaim policy
`Delete`) is deleted with its directory.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from ardiff.devcluster.kubeconfig import credentials_from_kubeconfig

STORAGE_CLASS = "ardiff-local"
PROVISIONER = "ardiff.dev/local-path"
PERIOD_SECONDS = 1.0


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def build_volume(claim: dict[str, Any], root: Path) -> dict[str, Any]:
    meta, spec = claim["metadata"], claim["spec"]
    path = root / meta["namespace"] / f"{meta['name']}-{meta['uid']}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


def provision_once(client: httpx.Client, root: Path) -> None:
    claims = client.get("/api/v1/persistentvolumeclaims").json()["items"]
    volumes = {v["metadata"]["name"]: v for v in client.get("/api/v1/persistentvolumes").json()["items"]}
    for claim in claims:
        pending = (claim.get("status") or {}).get("phase") == "Pending" and not claim["spec"].get(
            "volumeName"
        )
        if pending and claim["spec"].get("storageClassName") == STORAGE_CLASS:
            volume = build_volume(claim, root)
            if volume["metadata"]["name"] not in volumes:
                Path(volume["spec"]["hostPath"]["path"]).mkdir(parents=True, exist_ok=True, mode=0o777)
                client.post("/api/v1/persistentvolumes", json=volume)
    for name, volume in volumes.items():
        ours = (volume["metadata"].get("annotations") or {}).get(
            "pv.kubernetes.io/provisioned-by"
        ) == PROVISIONER
        if ours and (volume.get("status") or {}).get("phase") == "Released":
            shutil.rmtree(volume["spec"]["hostPath"]["path"], ignore_errors=True)
            client.delete(f"/api/v1/persistentvolumes/{name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kubeconfig", type=Path)
    parser.add_argument("root", type=Path)
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    credentials = credentials_from_kubeconfig(args.kubeconfig)
    with credentials.client(timeout=10) as client:
        while True:
            try:
                provision_once(client, args.root)
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                print(f"provisioner: {exc}", file=sys.stderr, flush=True)
            time.sleep(PERIOD_SECONDS)


if __name__ == "__main__":
    main()
