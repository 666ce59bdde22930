"""`ardiff operator smoke-test`: create a session on a pool, wait until it is Ready, tick it once, delete it
(the chart's `helm test`). Exit 0 when the tick answered 200; the session is deleted in every case. With
`gateway_url` the tick goes through the front door (issue 37: `<gateway_url>/pools/<namespace>/<pool>`, the
gateway's in-cluster Service), as a client outside the cluster's does; else to the session's Pod, a pool
with `spec.tls` over https, verified against its TLS Secret's `ca.crt`. The tick is sent again (the
same request: ticks are idempotent) while it gets no answer or a 503 (a worker Ready a moment before its
address resolves or answers), until the test's deadline."""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import time
from collections.abc import Callable

import httpx

from ardiff.wire import API_VERSION, GROUP, POOL_PLURAL, SESSION_PLURAL, VERSION, front_door_url

POLL_SECONDS = 1.0
# Answers that say "not yet" (docs/contracts.md: retry the same tick); any other answer is the test's result.
RETRIED_STATUSES = frozenset({503})


def smoke_test(
    namespace: str,
    pool: str,
    *,
    timeout_seconds: float,
    gateway_url: str | None = None,
    say: Callable[[str], None] = print,
) -> bool:
    """True when a new session on `pool` became Ready within `timeout_seconds` and its first tick got 200
    (through the front door at `gateway_url` when given)."""
    import kubernetes

    from ardiff.operator.uninstall import _clients

    custom, core = _clients()
    verify = _pool_verify(custom, core, namespace, pool)
    name = f"helm-test-{secrets.token_hex(3)}"
    body = {
        "apiVersion": API_VERSION,
        "kind": "ARDiffusionSession",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"poolRef": pool, "prompt": "a quiet street in the rain"},
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, body)  # type: ignore[attr-defined]
    say(f"created session {namespace}/{name} on pool {pool}")
    try:
        deadline = time.monotonic() + timeout_seconds
        status: dict = {}
        while time.monotonic() < deadline:
            status = (
                custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, name).get(  # type: ignore[attr-defined]
                    "status"
                )
                or {}
            )
            if status.get("phase") in ("Ready", "Failed"):
                break
            time.sleep(POLL_SECONDS)
        if status.get("phase") != "Ready":
            say(f"session {name} is not Ready after {timeout_seconds:g} s: {json.dumps(status)[:500]}")
            return False
        ref = status["tokenSecretRef"]  # {name, key}
        reply = core.read_namespaced_secret(ref["name"], namespace, _preload_content=False)  # type: ignore[attr-defined]
        token = base64.b64decode(json.loads(reply.data)["data"][ref["key"]]).decode()
        base = front_door_url(gateway_url, namespace, pool) if gateway_url else status["endpoint"]
        url = f"{base}/v1/sessions/{name}/ticks"
        tick = post_first_tick(
            url, name, token, deadline=deadline, verify=True if gateway_url else verify, say=say
        )
        if tick is None:
            return False
        say(f"tick 0 of {name} on {status['pod']} at {base}: HTTP {tick.status_code}, {len(tick.content)} B")
        return tick.status_code == 200
    finally:
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, name)  # type: ignore[attr-defined]
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
        say(f"deleted session {name}")


def post_first_tick(
    url: str,
    name: str,
    token: str,
    *,
    deadline: float,
    verify: ssl.SSLContext | bool,
    say: Callable[[str], None],
) -> httpx.Response | None:
    """Session `name`'s tick 0, sent again while it gets no answer or a 503 and `deadline` (monotonic) has not
    passed; the answer, or None when none came."""
    while True:
        try:
            reply = httpx.post(
                url,
                json={"request_id": f"{name}-0", "chunk_index": 0},
                headers={"Authorization": f"Bearer {token}"},
                timeout=max(60.0, deadline - time.monotonic()),
                verify=verify,
            )
        except httpx.TransportError as exc:
            if time.monotonic() >= deadline:
                say(f"tick 0 of {name} got no answer from {url}: {type(exc).__name__}: {exc}")
                return None
            say(f"tick 0 of {name}: {type(exc).__name__}: {exc}; sending it again")
        else:
            if reply.status_code not in RETRIED_STATUSES or time.monotonic() >= deadline:
                return reply
            say(f"tick 0 of {name}: HTTP {reply.status_code}; sending it again")
        time.sleep(POLL_SECONDS)


def _pool_verify(custom: object, core: object, namespace: str, pool: str) -> ssl.SSLContext | bool:
    """How the tick verifies the pool's workers: a pool with `spec.tls` against its Secret's `ca.crt`, when it
    has one; else (no TLS, or a certificate of a public CA) against the system's CAs."""
    import kubernetes

    try:
        found = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, POOL_PLURAL, pool)  # type: ignore[attr-defined]
    except kubernetes.client.exceptions.ApiException as exc:
        if exc.status != 404:
            raise
        return True  # no such pool: its session says so (never Ready)
    spec = found.get("spec") or {}
    secret_name = (spec.get("tls") or {}).get("secretName")
    if not secret_name:
        return True
    reply = core.read_namespaced_secret(secret_name, namespace, _preload_content=False)  # type: ignore[attr-defined]
    ca = (json.loads(reply.data).get("data") or {}).get("ca.crt")
    return ssl.create_default_context(cadata=base64.b64decode(ca).decode()) if ca else True
