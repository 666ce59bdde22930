"""What a session's status costs the real API server (issue 27 item 1): kube-apiserver + etcd CPU per status
write, for the status the operator's admission writes against the one-field status of
`benchmarks/reconcile.py`'s bare kopf baseline.

On one dev cluster (real etcd and kube-apiserver), `--sessions` ARDiffusionSessions are created in a namespace
of their own per arm, then each gets one merge-patch of its `status` subresource from `--clients` concurrent
clients (kopf's write of a create handler's status), and the CPU kube-apiserver + etcd spent on the patches
is divided by their number. Arms:
- `phase only`: `{"phase": "Ready"}`, the baseline's;
- `admission`: what the operator writes for a session placed on a Ready pod (`build_session_status`: phase,
  reason, message, pod, epoch, endpoint, token Secret, playout, the Ready condition, ...), on crds/ as shipped
  (the status `x-kubernetes-map-type: atomic`: one field to the API server's managedFields);
- `admission, no conditions`: the same without `conditions` (what the Ready condition alone costs);
- `admission, field by field`: the admission status on a copy of the session CRD (group `GRANULAR_GROUP`)
  whose status is tracked field by field, as crds/ had it before the status became atomic.

The arms run interleaved, `--rounds` times (every other round in reverse order); printed: each round's CPU
per patch, the median, and each arm's median over the baseline's.

    .venv/bin/python benchmarks/status_cost.py [--sessions 600] [--clients 8] [--rounds 3]   # ~2 minutes

`--smoke`: 50 sessions per arm, 2 clients, 2 rounds (the second in reverse order). Its test
(tests/operator/test_status_cost_benchmark.py) runs it in-process on the test session's dev cluster
(`measure` and `report`).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconcile import component_pids, cpu_seconds, create_namespace, session_body

from ardiff.devcluster.cluster import DevCluster, load_manifests
from ardiff.devcluster.kubeconfig import Credentials
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.records import PodRecord, SessionBinding, SessionState
from ardiff.operator.specs import Playout
from ardiff.operator.status import SessionObservation, build_session_status
from ardiff.operator.status_writer import now_rfc3339
from ardiff.wire import GROUP, SESSION_PLURAL, VERSION

POD = "bench-workers-7c9f2"
GRANULAR_GROUP = "granular-status.ardiffusion.dev"


def admission_status(name: str) -> dict[str, Any]:
    """The status the operator's create handler returns for a session placed on a Ready pod."""
    binding = SessionBinding(
        name=name,
        state=SessionState.PLACED,
        pod=POD,
        pod_epoch=1,
        reset_required=False,
        chunk_index=0,
        last_tick_ms=0,
        playout_fps=16.0,
        playout_buffer_chunks=2,
    )
    pod = PodRecord(
        name=POD,
        capacity=275,
        used=1,
        endpoint="http://10.244.1.7:8000",
        epoch=1,
        lease_expires_ms=1,  # live: past `now_ms` below
        draining=False,
    )
    observation = SessionObservation(record=binding, pod=pod, pod_ready=True, now_ms=0, playout=Playout())
    return build_session_status({}, observation, session=name, generation=1, now=now_rfc3339())


def without_conditions(name: str) -> dict[str, Any]:
    return {k: v for k, v in admission_status(name).items() if k != "conditions"}


@dataclass(frozen=True)
class Arm:
    status: Callable[[str], dict[str, Any]]
    group: str = GROUP  # the API group of the session CRD its sessions are made from


ARMS = {
    "phase only (baseline)": Arm(lambda name: {"phase": "Ready"}),
    "admission": Arm(admission_status),
    "admission, no conditions": Arm(without_conditions),
    "admission, field by field": Arm(admission_status, GRANULAR_GROUP),
}


def granular_session_crd() -> dict[str, Any]:
    """The session CRD under `GRANULAR_GROUP`, its status tracked field by field (not atomic)."""
    doc = copy.deepcopy(
        next(d for d in load_manifests() if d["metadata"]["name"] == f"{SESSION_PLURAL}.{GROUP}")
    )
    doc["spec"]["group"] = GRANULAR_GROUP
    doc["metadata"]["name"] = f"{SESSION_PLURAL}.{GRANULAR_GROUP}"
    del doc["spec"]["names"]["shortNames"], doc["spec"]["names"]["categories"]  # kubectl finds only ours
    for version in doc["spec"]["versions"]:
        del version["schema"]["openAPIV3Schema"]["properties"]["status"]["x-kubernetes-map-type"]
    return doc


async def patch_statuses(
    cluster: DevCluster,
    credentials: Credentials,
    namespace: str,
    arm: Arm,
    args: Any,
) -> float:
    """Create the sessions, then patch each one's status once; kube-apiserver + etcd CPU ms per patch."""
    path = f"/apis/{arm.group}/{VERSION}/namespaces/{namespace}/{SESSION_PLURAL}"
    names = [f"s-{i:04d}" for i in range(args.sessions)]
    async with credentials.async_client(timeout=60) as client:

        async def each(chunk: list[str], call: Callable[[str], Any]) -> None:
            for name in chunk:
                (await call(name)).raise_for_status()

        def create(name: str) -> Any:
            body = session_body(name, "bench")
            body["apiVersion"] = f"{arm.group}/{VERSION}"
            return client.post(path, json=body)

        def patch(name: str) -> Any:
            return client.patch(
                f"{path}/{name}/status",
                content=json.dumps({"status": arm.status(name)}),
                headers={"Content-Type": "application/merge-patch+json"},
            )

        await asyncio.gather(*(each(names[i :: args.clients], create) for i in range(args.clients)))
        api = component_pids(cluster)
        before = cpu_seconds(api)
        await asyncio.gather(*(each(names[i :: args.clients], patch) for i in range(args.clients)))
        return 1000 * (cpu_seconds(api) - before) / len(names)


SMOKE = argparse.Namespace(sessions=50, clients=2, rounds=2)  # fewer patches than 50 can measure 0 CPU


def measure(cluster: DevCluster, args: argparse.Namespace, prefix: str = "status") -> dict[str, list[float]]:
    """Each arm's API+etcd CPU ms per patch, round by round, on `cluster` (its namespaces `<prefix>-...`)."""
    results: dict[str, list[float]] = {name: [] for name in ARMS}
    assert cluster.control_plane is not None
    cluster.control_plane.apply([granular_session_crd()])
    with cluster.admin.client() as client:
        served = f"/apis/{GRANULAR_GROUP}/{VERSION}"
        wait_until(lambda: client.get(served).status_code == 200, timeout=30, what=f"{served} served")
    for r in range(args.rounds):
        order = list(ARMS) if r % 2 == 0 else list(ARMS)[::-1]
        for i, arm in enumerate(order):
            namespace = f"{prefix}-{r}-{i}"
            create_namespace(cluster, namespace)
            ms = asyncio.run(patch_statuses(cluster, cluster.admin, namespace, ARMS[arm], args))
            results[arm].append(ms)
    return results


def report(results: dict[str, list[float]], args: argparse.Namespace) -> None:
    sizes = {name: len(json.dumps(arm.status("s-0000"))) for name, arm in ARMS.items()}
    base = statistics.median(results["phase only (baseline)"])
    print(
        f"\n{args.sessions} status patches per arm and round, {args.clients} clients, {args.rounds} rounds\n"
    )
    header = (
        f"{'status':<26} {'JSON bytes':>10} {'API+etcd CPU ms per patch, each round':>40} "
        f"{'median':>7} {'÷ base':>7}"
    )
    print(header)
    print("-" * len(header))
    for arm, values in results.items():
        median = statistics.median(values)
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"{arm:<26} {sizes[arm]:>10} {each:>40} {median:>7.2f} {median / base:>6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="50 sessions, 2 clients, 2 rounds (the test's)")
    args = parser.parse_args()
    if args.smoke:
        args.sessions, args.clients, args.rounds = SMOKE.sessions, SMOKE.clients, SMOKE.rounds
    with DevCluster(Path(tempfile.mkdtemp(prefix="ardiff-bench-status-"))) as cluster:
        results = measure(cluster, args)
    report(results, args)


if __name__ == "__main__":
    main()
