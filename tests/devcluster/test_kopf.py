"""Real kopf against the emulated API: finalizers, annotations, status, timers, Events, deletion, peering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from kopf.testing import KopfRunner

from ardiff.devcluster.kube_api import KubeAPIThread
from ardiff.devcluster.waiting import wait_until

PROBE = Path(__file__).with_name("kopf_probe.py")
MERGE = {"Content-Type": "application/merge-patch+json"}


def test_kopf_runs_a_session_lifecycle(kube_api: KubeAPIThread, kube_namespace: str) -> None:
    ns = kube_namespace
    sessions = f"/apis/ardiffusion.dev/v1alpha1/namespaces/{ns}/ardiffusionsessions"
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "probe"}}
    with httpx.Client(base_url=kube_api.url, timeout=10) as api:
        api.post(f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings", json=peering).raise_for_status()
        args = ["run", "--namespace", ns, "--peering", "probe", str(PROBE)]
        with KopfRunner(args, timeout=60) as runner:
            body = {"metadata": {"name": "s1"}, "spec": {"poolRef": "tiny-world", "prompt": "x"}}
            api.post(sessions, json=body).raise_for_status()

            def session() -> dict[str, Any]:
                return api.get(f"{sessions}/s1").json()

            # kopf records the handled state once every creation handler is done.
            handled = "ardiffusion.dev/last-handled-configuration"
            accepted = wait_until(
                lambda: s if handled in (s := session())["metadata"].get("annotations", {}) else None
            )
            assert accepted["status"]["accept"] == {"seen": "s1"}  # a handler result, kept by the schema
            assert accepted["status"]["phase"] == "Pending"
            assert accepted["metadata"]["finalizers"] == ["ardiffusion.dev/finalizer"]
            annotations = accepted["metadata"]["annotations"]
            assert not [key for key in annotations if key.startswith("kopf.zalando.org")]

            api.patch(f"{sessions}/s1", json={"spec": {"priority": 5}}, headers=MERGE).raise_for_status()
            wait_until(lambda: session().get("status", {}).get("reason") == "priority 5")
            wait_until(lambda: session()["status"].get("chunkIndex", 0) >= 2)  # the timer patches status

            events = api.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
            assert [e["reason"] for e in events if e["reason"] == "Accepted"] == ["Accepted"]
            peers = api.get(f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings/probe").json()
            assert len(peers.get("status") or {}) == 1  # this operator announced itself

            api.delete(f"{sessions}/s1").raise_for_status()
            wait_until(lambda: api.get(f"{sessions}/s1").status_code == 404)
    assert runner.exception is None
    assert runner.exit_code == 0
    assert "CLOSED s1" in runner.output
