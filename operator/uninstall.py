"""`ardiff operator uninstall`: delete every session and pool of the served namespaces and wait until they
and their worker Pods are gone (the chart's pre-delete hook).

Why a hook: sessions users created are not part of the helm release, so `helm uninstall` alone would leave
them; and run before the operator goes, the operator still frees their slots and the pools' Redis state at
once (without it, its sweep does that the next time an operator runs: docs/contracts.md §5 "Deletion").
Waiting for the Pods means their GPUs are free when `helm uninstall` returns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ardiff.wire import GROUP, POOL_PLURAL, SESSION_PLURAL, VERSION

WORKER_SELECTOR = "app.kubernetes.io/name=ardiff,app.kubernetes.io/component=worker"
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Leftovers:
    """What is still there in one namespace."""

    namespace: str
    sessions: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.sessions or self.pools or self.pods)

    def describe(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("sessions", self.sessions),
                ("pools", self.pools),
                ("worker pods", self.pods),
            )
            if names
        ]
        return f"{self.namespace}: " + "; ".join(parts)


def _clients() -> tuple[object, object]:
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.CustomObjectsApi(), kubernetes.client.CoreV1Api()


def _names(items: list[dict]) -> tuple[str, ...]:
    return tuple(sorted(item["metadata"]["name"] for item in items))


def uninstall(
    namespaces: Sequence[str] | None,
    *,
    all_namespaces: bool = False,
    timeout_seconds: float,
    say: Callable[[str], None] = print,
) -> list[Leftovers]:
    """Delete the sessions, then the pools, of `namespaces` (or of every namespace holding one); wait up to
    `timeout_seconds` until none of them and none of their worker Pods is left. What is left (empty: all
    gone)."""
    from kubernetes.client.exceptions import ApiException

    custom, core = _clients()
    if all_namespaces:
        namespaces = sorted(
            {
                item["metadata"]["namespace"]
                for plural in (SESSION_PLURAL, POOL_PLURAL)
                for item in custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"]  # type: ignore[attr-defined]
            }
        )
    namespaces = list(namespaces or ())
    if not namespaces:
        say("no session or pool to delete")
        return []

    def leftovers(namespace: str) -> Leftovers:
        def items(plural: str) -> list[dict]:
            return custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]  # type: ignore[attr-defined]

        # Names only, read as JSON: no typed models to validate (quantities and all).
        reply = core.list_namespaced_pod(namespace, label_selector=WORKER_SELECTOR, _preload_content=False)  # type: ignore[attr-defined]
        pods = [pod["metadata"]["name"] for pod in json.loads(reply.data)["items"]]
        return Leftovers(
            namespace,
            _names(items(SESSION_PLURAL)),
            _names(items(POOL_PLURAL)),
            tuple(sorted(pods)),
        )

    # Sessions first: the operator frees their slots while their pools still exist.
    for plural in (SESSION_PLURAL, POOL_PLURAL):
        for namespace in namespaces:
            for name in getattr(leftovers(namespace), "sessions" if plural == SESSION_PLURAL else "pools"):
                try:
                    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)  # type: ignore[attr-defined]
                    say(f"deleting {plural} {namespace}/{name}")
                except ApiException as exc:
                    if exc.status != 404:
                        raise
    deadline = time.monotonic() + timeout_seconds
    while True:
        left = [found for found in map(leftovers, namespaces) if found]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    for found in left:
        say(f"still there after {timeout_seconds:g} s: {found.describe()}")
    if not left:
        say(f"no session, pool or worker pod is left in {', '.join(namespaces)}")
    return left
