"""The front door's Redis credentials (issue 37; docs/contracts.md §2 "Users", §5).

With `--gateway-redis-secret NAME` the operator keeps Secret NAME in its own namespace: key `url` (its worker
Redis URL, `--worker-redis-url`, logging in as the gateway's user: built as a pool's workers' is, with
`ca.crt` where that URL names a CA), `redis-username` and `redis-password`. With `--worker-redis-users
operator` it makes the user, `ardiff-gateway.<its namespace>` reading the pools of the namespaces it watches
(kv/acl.py `gateway_rules`), on every Redis node, with a password it makes once and keeps; removing the key
`redis-password` rotates it, and the user keeps accepting the passwords it had for `ROTATION_GRACE_SECONDS`
after the rotation (the time is the Secret's annotation, so every operator of a peering agrees), while the
gateway's Pods pick up the new one. With `administrator` the administrator makes the user and writes both
keys; the operator sends no ACL command and fills in `url`. At startup and then every `reconcile_seconds` (a
node that restarted without the user gets it back within one); each problem is logged once, as a warning.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Mapping
from typing import Any

import kopf

from ardiff.kv.acl import AclForbidden, gateway_rules, gateway_username
from ardiff.operator.config import OperatorConfig
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import SECRETS
from ardiff.operator.permissions import Permission, named_secret
from ardiff.operator.pods import (
    COMPONENT_LABEL,
    REDIS_CA_KEY,
    REDIS_PASSWORD_KEY,
    REDIS_URL_KEY,
    REDIS_USERNAME_KEY,
    new_redis_password,
    read_redis_ca,
    redis_secret_data,
)
from ardiff.operator.status_writer import now_rfc3339
from ardiff.operator.worker_credentials import (
    ACL_FORBIDDEN,
    CREDENTIALS_MISSING,
    stored_user,
    valid_password,
)

GATEWAY_COMPONENT = "gateway"
# The keys of the gateway's Secret the operator writes (any other key is left as it is).
GATEWAY_SECRET_KEYS = (REDIS_URL_KEY, REDIS_CA_KEY, REDIS_USERNAME_KEY, REDIS_PASSWORD_KEY)
# When the operator last made a new password (RFC 3339): the previous ones are accepted until this long after.
ROTATED_AT_ANNOTATION = "ardiffusion.dev/redis-password-rotated-at"
ROTATION_GRACE_SECONDS = 300.0
# Any other failure to keep the credentials (a Redis node or the API server away), reported once too.
CREDENTIALS_FAILED = "RedisCredentialsFailed"


def gateway_secret_permissions(config: OperatorConfig) -> list[tuple[Permission, str]]:
    """What `--gateway-redis-secret` needs in the operator's own namespace: the Secret read and patched by
    name, and created where the operator makes the user; none without the setting."""
    namespace, name = config.operator_namespace, config.gateway_redis_secret
    if namespace is None or name is None:
        return []
    permissions = named_secret(name, creates=config.worker_redis_users == "operator")
    return [(p, namespace) for p in permissions]


def build_gateway_secret(namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
    """The gateway's Secret (`data`: base64 values), owned by nobody: it lives as long as the release."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "ardiff", COMPONENT_LABEL: GATEWAY_COMPONENT},
        },
        "data": dict(data),
    }


def keeps_previous(annotations: Mapping[str, str], now: float) -> bool:
    """Whether the gateway's user still accepts the passwords it had: within `ROTATION_GRACE_SECONDS` of the
    rotation the Secret records (`now`: epoch seconds)."""
    try:
        rotated = datetime.datetime.fromisoformat(annotations.get(ROTATED_AT_ANNOTATION) or "")
    except ValueError:
        return False
    return 0 <= now - rotated.timestamp() < ROTATION_GRACE_SECONDS


def administrator_command(namespace: str, served: tuple[str, ...] | None) -> str:
    """The `ACL SETUSER` an administrator runs to make the gateway's user, its password left to fill in."""
    username = gateway_username(namespace)
    return " ".join(("ACL", "SETUSER", username, "reset", "on", ">PASSWORD", *gateway_rules(served)))


async def ensure_gateway_credentials(ctx: OperatorContext, logger: kopf.Logger) -> None:
    """Bring the gateway's Secret (and, made by the operator, its Redis user on every node) up to date, or
    report why not."""
    config = ctx.config
    namespace, name = config.operator_namespace, config.gateway_redis_secret
    assert namespace is not None, "OperatorConfig requires it with the Secret"
    assert name is not None, "called only with --gateway-redis-secret"
    username = gateway_username(namespace)
    served = None if config.all_namespaces else config.namespaces
    operator_made = config.worker_redis_users == "operator"
    stored = await ctx.kube.get(SECRETS, namespace, name)
    if stored is None and operator_made:
        # Made with its user first and no URL: operators racing here all read back the one password kept.
        user_only = redis_secret_data(None, user=(username, new_redis_password()))
        stored = await ctx.kube.create_or_get(SECRETS, build_gateway_secret(namespace, name, user_only))
        if stored is None:  # deleted between the two calls: made again next time
            return
    data: dict[str, str] = (stored or {}).get("data") or {}
    annotations: dict[str, str] = (stored or {}).get("metadata", {}).get("annotations") or {}
    user = stored_user(data)
    rotated_at = None
    if operator_made and (user is None or user[0] != username or not valid_password(user[1])):
        user = (username, new_redis_password())  # its password removed (a rotation), or edited into another
        rotated_at = now_rfc3339()
        annotations = {**annotations, ROTATED_AT_ANNOTATION: rotated_at}
    if stored is None or user is None:
        message = (
            f"Secret {name} of namespace {namespace} names no Redis user (or does not exist): with "
            f"--worker-redis-users administrator, make the gateway's user "
            f"(`{administrator_command(namespace, served)}`) and write its name and password into that "
            f"Secret's keys {REDIS_USERNAME_KEY} and {REDIS_PASSWORD_KEY}"
        )
        report_problem(ctx, CREDENTIALS_MISSING, message, logger)
        return
    wanted = redis_secret_data(config.worker_redis_url, read_redis_ca(config.worker_redis_url), user)
    if operator_made:
        assert ctx.pool_users is not None, "configure() gives an operator that makes users its PoolUsers"
        try:
            sync = await ctx.pool_users.ensure_gateway(
                namespace, served, user[1], keep_previous=keeps_previous(annotations, time.time())
            )
        except AclForbidden as exc:
            report_problem(ctx, ACL_FORBIDDEN, str(exc), logger)
            return
        if sync.changed:
            logger.info(f"redis user {username} made or updated on {', '.join(sync.changed)}")
    if rotated_at is not None or any(data.get(k) != wanted.get(k) for k in GATEWAY_SECRET_KEYS):
        # Merge patch: a key no longer made (a CA no longer named) is removed; others of the Secret stay.
        patch: dict[str, Any] = {"data": {k: wanted.get(k) for k in GATEWAY_SECRET_KEYS}}
        if rotated_at is not None:
            patch["metadata"] = {"annotations": {ROTATED_AT_ANNOTATION: rotated_at}}
        await ctx.kube.patch(SECRETS, namespace, name, patch)
    if ctx.gateway_problem is not None:
        ctx.gateway_problem = None
        logger.info(f"the gateway's Redis credentials in Secret {namespace}/{name} are usable again")


def report_problem(ctx: OperatorContext, reason: str, message: str, logger: kopf.Logger) -> None:
    """Say why the gateway has no usable credentials: a warning, once per reason (no Event: kopf posts those
    only from an object's handlers, and the Secret is no object the operator watches)."""
    if ctx.gateway_problem != reason:
        ctx.gateway_problem = reason
        logger.warning(f"the gateway's Redis credentials: {reason}: {message}")


async def keep_gateway_credentials(ctx: OperatorContext, logger: kopf.Logger) -> None:
    """`ensure_gateway_credentials` at startup and every `reconcile_seconds`; a failure is reported once and
    tried again next time."""
    while True:
        try:
            await ensure_gateway_credentials(ctx, logger)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a Redis node or the API server away
            report_problem(ctx, CREDENTIALS_FAILED, f"{type(exc).__name__}: {exc}", logger)
        await asyncio.sleep(ctx.config.reconcile_seconds)
