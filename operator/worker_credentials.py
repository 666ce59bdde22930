"""The pool's workers' Redis credentials: its `<pool>-workers-redis` Secret (the workers' Redis URL, CA,
user and transfer token) and, with `--worker-redis-users operator`, its Redis user on every node. A round
brings both up to date before anything else (the Secret's digest is part of the Pod template) and learns
whether new worker Pods may start with them; each problem is reported once, with a Warning Event.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import kopf

from ardiff.kv.acl import AclForbidden, InvalidPoolUser, check_password, pool_username
from ardiff.kv.records import PoolId
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import SECRETS
from ardiff.operator.pods import (
    REDIS_CA_KEY,
    REDIS_PASSWORD_KEY,
    REDIS_URL_KEY,
    REDIS_USERNAME_KEY,
    TRANSFER_TOKEN_KEY,
    build_worker_redis_secret,
    new_redis_password,
    new_transfer_token,
    read_redis_ca,
    secret_data_hash,
)
from ardiff.operator.pool_state import PoolState
from ardiff.operator.views import PodView, PoolView

# Why a pool's workers have no usable Redis credentials: the reason of its Progressing condition and of the
# Warning Event (once) that says so.
SECRET_CONFLICT = "SecretConflict"
ACL_FORBIDDEN = "RedisAclForbidden"
CREDENTIALS_MISSING = "RedisCredentialsMissing"
# The keys of `<pool>-workers-redis` the operator writes (any other key is left as it is).
WORKER_SECRET_KEYS = (REDIS_URL_KEY, REDIS_CA_KEY, TRANSFER_TOKEN_KEY, REDIS_USERNAME_KEY, REDIS_PASSWORD_KEY)


@dataclass(frozen=True)
class WorkerCredentials:
    """What a round made of the pool's `<pool>-workers-redis` Secret: whether worker Pods may start with it
    (its URL logs in as the pool's Redis user, which exists on every node), the digest of its data (None: no
    Secret of the pool's), and otherwise why not: (reason, message) for the pool's Progressing condition."""

    usable: bool
    secret_hash: str | None
    problem: tuple[str, str] | None = None


def stored_user(data: Mapping[str, str]) -> tuple[str, str] | None:
    """The Redis user and password a workers' Secret names (keys `redis-username`, `redis-password`)."""
    username, password = (
        base64.b64decode(data.get(key) or "").decode(errors="replace")
        for key in (REDIS_USERNAME_KEY, REDIS_PASSWORD_KEY)
    )
    return (username, password) if username and password else None


async def ensure_worker_redis_secret(
    ctx: OperatorContext, state: PoolState, pool: PoolView, pods: Sequence[PodView], logger: kopf.Logger
) -> WorkerCredentials:
    """Create the pool's `<pool>-workers-redis` Secret, or bring it up to date: the operator's worker URL
    (it may have changed since it was written) with the pool's own Redis user in it, the transfer token.

    With `--worker-redis-users operator` the operator makes the user (`ardiff-pool.<ns>.<pool>`, a random
    password, a new one when the key `redis-password` is removed) on every Redis node before the Secret
    names it; while Pods made from an older Secret run (their env is fixed at start) the user keeps
    accepting the passwords it had. With `administrator` the Secret's `redis-username` and `redis-password`
    are the administrator's, and no ACL command is sent. A Secret of that name the pool does not own is left
    alone. Each problem is reported once (a Warning Event) and blocks new worker Pods."""
    url = ctx.config.worker_redis_url
    pid = PoolId(pool.namespace, pool.name)
    operator_made = ctx.config.worker_redis_users == "operator"
    fresh_user = (pool_username(pid), new_redis_password())
    ca = read_redis_ca(url)
    # Made without a URL or a user: those are written once the user exists (below).
    secret = build_worker_redis_secret(pool.namespace, pool.name, None, transfer_token=new_transfer_token())
    kopf.adopt(secret, owner=pool.reference)
    name = secret["metadata"]["name"]
    # Read first: every round comes here, and a create would be refused (409) but for the first.
    stored = await ctx.kube.get(SECRETS, pool.namespace, name) or await ctx.kube.create_or_get(
        SECRETS, secret
    )
    if stored is None:  # deleted between the two calls: the next round creates it
        return WorkerCredentials(False, None)
    owners = stored["metadata"].get("ownerReferences") or []
    if not any(owner.get("uid") == pool.uid for owner in owners):
        message = f"Secret {name} exists and is not owned by this pool: rename or delete it"
        return credentials_problem(state, pool, SECRET_CONFLICT, message, None)
    stored_data: dict[str, str] = stored.get("data") or {}
    # The transfer token is made once and kept (a new one would split the pool's running pods); a Secret
    # written before it existed gets one.
    token = stored_data.get(TRANSFER_TOKEN_KEY) or secret["data"][TRANSFER_TOKEN_KEY]
    user = stored_user(stored_data)
    if operator_made and (user is None or user[0] != fresh_user[0] or not valid_password(user[1])):
        user = fresh_user  # first made, rotated (its password removed), or edited into something else
    if user is None:
        message = (
            f"Secret {name} names no Redis user: with --worker-redis-users administrator, make the pool's "
            f"user (`ardiff kv redis-user {pool.namespace} {pool.name}` prints its rules) and write its name "
            f"and password into keys {REDIS_USERNAME_KEY} and {REDIS_PASSWORD_KEY}"
        )
        return credentials_problem(state, pool, CREDENTIALS_MISSING, message, secret_data_hash(stored_data))
    data = build_worker_redis_secret(
        pool.namespace,
        pool.name,
        url,
        ca,
        transfer_token=base64.b64decode(token).decode(),
        user=user,
    )["data"]
    digest = secret_data_hash(data)
    if operator_made:
        assert ctx.pool_users is not None, "configure() gives an operator that makes users its PoolUsers"
        rolling = any(p.secret_hash != digest for p in pods)  # older Pods log in with an older password
        try:
            sync = await ctx.pool_users.ensure(pid, user[1], keep_previous=rolling)
        except AclForbidden as exc:
            return credentials_problem(state, pool, ACL_FORBIDDEN, str(exc), secret_data_hash(stored_data))
        if sync.changed:
            logger.info(f"redis user {user[0]} made or updated on {', '.join(sync.changed)}")
    if any(stored_data.get(k) != data.get(k) for k in WORKER_SECRET_KEYS):
        # Merge patch: a key no longer made (a CA no longer named) is removed; others of the Secret stay.
        patch = {"data": {k: data.get(k) for k in WORKER_SECRET_KEYS}}
        await ctx.kube.patch(SECRETS, pool.namespace, name, patch)
    state.credential_problem = None
    return WorkerCredentials(True, digest)


def valid_password(password: str) -> bool:
    try:
        check_password(password)
    except InvalidPoolUser:
        return False
    return True


def credentials_problem(
    state: PoolState, pool: PoolView, reason: str, message: str, secret_hash: str | None
) -> WorkerCredentials:
    """Report why the pool's workers have no usable credentials: a Warning Event the first time."""
    if state.credential_problem != reason:
        state.credential_problem = reason
        kopf.event(pool.reference, type="Warning", reason=reason, message=message)
    return WorkerCredentials(False, secret_hash, (reason, message))
