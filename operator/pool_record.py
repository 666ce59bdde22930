"""The pool's record in the store (issue 37, `PlacementStore.write_pool`), written by every pool round after
its restores of the bindings Redis lost (not while one still waits for its pod to register again): its
presence tells the front door that the store holds the pool's data. It carries the CA bundle that verifies the
pool's Pods over https, the `ca.crt` of its `spec.tls.secretName` Secret ("" for a pool without `spec.tls`, or
whose Secret has none: a public CA's certificates). The Secret is read by name (never listed or watched: the
operator's Role), at most every `CA_REFRESH_SECONDS` per pool and whenever `spec.tls.secretName` changes: a CA
changes seldom, a round comes every few seconds.
"""

from __future__ import annotations

import base64
import time

from ardiff.kv.records import PoolId
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import SECRETS
from ardiff.operator.pods import TLS_CA_KEY
from ardiff.operator.pool_state import PoolCa, PoolState
from ardiff.operator.views import PoolView

CA_REFRESH_SECONDS = 30.0


async def pool_ca(ctx: OperatorContext, state: PoolState, pool: PoolId, secret_name: str | None) -> str:
    """The PEM bundle of the pool's TLS Secret's `ca.crt` ("" without `spec.tls`, without the key, or while
    the Secret does not exist), read again once `CA_REFRESH_SECONDS` have passed."""
    if secret_name is None:
        state.ca = None
        return ""
    known = state.ca
    now = time.monotonic()
    if known is None or known.secret_name != secret_name or now - known.read_at >= CA_REFRESH_SECONDS:
        secret = await ctx.kube.get(SECRETS, pool.namespace, secret_name)
        encoded = ((secret or {}).get("data") or {}).get(TLS_CA_KEY) or ""
        known = PoolCa(secret_name, base64.b64decode(encoded).decode(errors="replace"), now)
        state.ca = known
    return known.pem


async def write_pool_record(ctx: OperatorContext, state: PoolState, pool: PoolView) -> None:
    """The pool's record, with its CA; one small script call (a round writes it whether or not it changed: the
    store may have lost it since)."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    await ctx.store.write_pool(pid, tls_ca=await pool_ca(ctx, state, pid, pool.spec.tls_secret))
