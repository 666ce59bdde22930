"""The placement store's read the front door makes (issue 37; docs/contracts.md "Front door").

`route` answers, in one read-only round trip (`route.lua` by FCALL_RO), what the endpoint picker needs
to send a request for a session: the session's state, pod and token hash, the record of the pod it holds a
slot on (its `address`, lease and epoch) and the server time. The pod's key depends on the session's
binding, so the call declares the pod it expects (the picker remembers where each session was) and is
repeated with the right one when that was wrong (a plan, kv/scripts.py). The picker's one write, a resume
demand for a suspended session, is the worker's own `request_resume` (kv/placement_worker.py); kv/acl.py's
`GATEWAY_SCRIPTS` lists both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ardiff.kv.keys import PoolKeys
from ardiff.kv.records import PodRecord, PoolId, SessionState, check_name, check_pool
from ardiff.kv.scripts import Plan, ScriptRunner, as_text


@dataclass(frozen=True)
class SessionRoute:
    """What `route` read: the session's state (None: no record), the pod its record names and that pod's
    epoch when it was bound, its token hash, the record of the pod the request may go to (None: none), the
    server time, and the digest of the pool's CA from the pool record ('' for a plain pool; None: no pool
    record, the store lost its data or the operator does not serve the pool)."""

    session: str
    state: SessionState | None
    bound_pod: str
    pod_epoch: int
    token_sha256: str
    pod: PodRecord | None
    now_ms: int
    pool_ca_sha256: str | None

    @property
    def pool_known(self) -> bool:
        """The operator's pool record is there (the store holds the pool's data)."""
        return self.pool_ca_sha256 is not None

    @property
    def pod_live(self) -> bool:
        """The pod read has a live lease (its worker heartbeats)."""
        return self.pod is not None and self.pod.lease_expires_ms > self.now_ms

    @property
    def served_by_pod(self) -> bool:
        """The session is placed on the pod read, in the incarnation it was bound to, and that pod is live:
        the request goes there."""
        return (
            self.state is SessionState.PLACED
            and self.pod is not None
            and self.pod.name == self.bound_pod
            and self.pod.epoch == self.pod_epoch
            and self.pod_live
        )


class GatewayPlacement(ScriptRunner):
    """The front door's side of the store (see the module docstring)."""

    async def route(
        self, pool: PoolId, session: str, *, expected_pod: str = "", any_live: bool = False
    ) -> SessionRoute:
        """Where a request for `session` may go. `expected_pod`: the pod the caller last saw it on (read in
        the same round trip when right). `any_live`: when the session holds no slot on a live pod, read a
        live pod of the pool instead (for the requests any pod answers the same way)."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        plan = Plan(pods=[check_name("pod", expected_pod)] if expected_pod else [])
        _, reply = await self._run(
            "route",
            [keys.session(session), keys.pool_record, keys.leases],
            [int(any_live)],
            pool_keys=keys,
            plan=plan,
        )
        values, pod_name, pod_values, now_ms, ca_sha256 = reply
        pod = as_text(pod_name)
        state, bound_pod, pod_epoch, token = values if values else (None, b"", b"0", b"")
        return SessionRoute(
            session=session,
            state=SessionState(as_text(state)) if state else None,
            bound_pod=as_text(bound_pod),
            pod_epoch=int(pod_epoch or 0),
            token_sha256=as_text(token),
            pod=PodRecord.from_values(pod, pod_values) if pod else None,
            now_ms=int(now_ms),
            pool_ca_sha256=None if ca_sha256 is None else as_text(ca_sha256),
        )

    async def pool_ca(self, pool: PoolId) -> str:
        """The PEM bundle that verifies the pool's pods over https ('' for a plain pool or no record)."""
        keys = PoolKeys(check_pool(pool))
        return as_text(await self.client.hget(keys.pool_record, "tls_ca"))
