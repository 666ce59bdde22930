"""Turning an ARDiffusionSession into a placement request: its token Secret, its image bytes, its spec.

A session that cannot be admitted raises `AdmissionFailure` with the status reason it ends `Failed` with.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import kopf

from ardiff.kv.records import MAX_IMAGE_BYTES, SessionSpec, token_sha256
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import CONFIGMAPS, SECRETS
from ardiff.operator.specs import ImageRef, Playout, SessionResourceSpec
from ardiff.operator.status import Reason
from ardiff.operator.tokens import build_token_secret, new_token, read_token, token_secret_name
from ardiff.operator.views import PoolView, SessionView

# A Secret a session's `spec.image.secretKeyRef` may read carries this label with the value "true" (issue 23
# item 7): the operator may read every Secret of the namespace, and a session must not make it read, say, a
# service account's token into a placement record.
SESSION_IMAGE_LABEL = "ardiffusion.dev/session-image"


class AdmissionFailure(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def check_family(session: SessionView, pool: PoolView) -> None:
    """`AdmissionFailure(FamilyMismatch)` when the session's `spec.family` is not its pool's: the family
    serving the pool's `model.pipeline` (`ardiff.model_families`; CEL sees one object only, so the CRD
    cannot compare them). A pool whose pipeline no family serves has no family to compare with: its workers
    refuse to load, which its own status shows."""
    if session.spec is None or pool.spec is None:
        return
    pool_family = pool.spec.model.family
    if pool_family is None or pool_family == session.spec.family:
        return
    raise AdmissionFailure(
        Reason.FAMILY_MISMATCH,
        f"session family {session.spec.family!r} differs from pool {pool.name}'s family {pool_family!r} "
        f"(its model.pipeline {pool.spec.model.pipeline}); create the session with "
        f"spec.family: {pool_family} or on a {session.spec.family} pool",
    )


async def ensure_token_sha256(ctx: OperatorContext, session: SessionView) -> str:
    """Create the session's token Secret once (owned by the session); return the token's SHA-256."""
    secret = build_token_secret(session.namespace, session.name, new_token())
    kopf.adopt(secret, owner=session.reference)
    # One that exists (an earlier attempt, or an operator restart) keeps its token; one owned by another
    # object is a deleted session's of the same name that garbage collection has not removed yet (adopting it,
    # the new session would lose its token when it goes): wait for it.
    stored = await ctx.kube.create_or_get(SECRETS, secret)
    if stored is None:
        raise kopf.TemporaryError("token secret was deleted while being read", delay=1)
    owners = {ref.get("uid") for ref in stored["metadata"].get("ownerReferences") or ()}
    if session.uid not in owners:
        raise kopf.TemporaryError(
            f"token Secret {secret['metadata']['name']} belongs to another object (a deleted session of this "
            "name, not yet garbage-collected?): waiting for it to go",
            delay=1,
        )
    return token_sha256(read_token(stored))


async def read_token_sha256(ctx: OperatorContext, session: SessionView) -> str:
    secret = await ctx.kube.get(SECRETS, session.namespace, token_secret_name(session.name))
    if secret is None:
        return await ensure_token_sha256(ctx, session)
    return token_sha256(read_token(secret))


def decode_image(source: dict[str, Any], ref: ImageRef) -> bytes | None:
    binary = (source.get("binaryData") or {}).get(ref.key)
    data = (source.get("data") or {}).get(ref.key)
    try:
        if binary is not None:
            return base64.b64decode(binary, validate=True)
        if data is not None:
            # ConfigMap `data` is plain text; Secret `data` is base64, like ConfigMap `binaryData`.
            return base64.b64decode(data, validate=True) if ref.source == "secret" else data.encode()
    except (binascii.Error, ValueError):
        raise AdmissionFailure(
            Reason.INVALID_SPEC, f"image key {ref.key!r} of {ref.name} is not base64"
        ) from None
    return None


async def resolve_image(ctx: OperatorContext, namespace: str, ref: ImageRef | None) -> bytes:
    """The conditioning image's bytes from a ConfigMap/Secret key (b"" when the session has none)."""
    if ref is None:
        return b""
    kind = CONFIGMAPS if ref.source == "configMap" else SECRETS
    source = await ctx.kube.get(kind, namespace, ref.name)
    if source is not None and ref.source == "secret":
        labels = source.get("metadata", {}).get("labels") or {}
        if labels.get(SESSION_IMAGE_LABEL) != "true":
            raise AdmissionFailure(
                Reason.IMAGE_NOT_ALLOWED,
                f"secret {ref.name} is not labelled {SESSION_IMAGE_LABEL}=true: a session reads only the "
                "Secrets that opt in",
            )
    image = None if source is None else decode_image(source, ref)
    if image is None:
        raise AdmissionFailure(Reason.IMAGE_NOT_FOUND, f"{ref.source} {ref.name} has no key {ref.key!r}")
    if len(image) > MAX_IMAGE_BYTES:
        raise AdmissionFailure(
            Reason.INVALID_SPEC,
            f"image {ref.source} {ref.name}/{ref.key} has {len(image)} bytes, max {MAX_IMAGE_BYTES}",
        )
    return image


def build_placement_spec(
    name: str, spec: SessionResourceSpec, *, token_sha256: str, image: bytes, playout: Playout
) -> SessionSpec:
    """`playout`: the resolved target (`resolve_playout`)."""
    return SessionSpec(
        name=name,
        token_sha256=token_sha256,
        seed=spec.seed or 0,
        prompt=spec.prompt or "",
        image=image,
        max_chunks=spec.max_chunks,
        priority=spec.priority,
        eviction_policy=spec.eviction_policy,
        playout_fps=playout.fps,
        playout_buffer_chunks=playout.buffer_chunks,
        history_keep_chunks=spec.history_keep_chunks,
    )


def resolve_playout(session: SessionView, pool: PoolView | None) -> Playout:
    """The session's playout target (issue 25): each field of its spec.playout, else its pool's."""
    assert session.spec is not None
    default = pool.spec.playout if pool is not None and pool.spec is not None else Playout()
    return session.spec.playout.resolve(default)


async def placement_spec(
    ctx: OperatorContext, session: SessionView, pool: PoolView | None, *, create_token: bool = False
) -> SessionSpec:
    """The session's placement request: its token's hash (kept in memory: small, never changes), its image
    (read each time: up to 1 MiB, needed only when the session is about to get a slot) and its playout
    target resolved against `pool`."""
    if session.spec is None:
        raise AdmissionFailure(Reason.INVALID_SPEC, session.invalid_reason or "invalid spec")
    key = (session.namespace, session.name)
    sha = ctx.sessions.token_hashes.get(key)
    if sha is None:
        sha = await (ensure_token_sha256 if create_token else read_token_sha256)(ctx, session)
        ctx.sessions.token_hashes[key] = sha
    image = await resolve_image(ctx, session.namespace, session.spec.image)
    try:
        return build_placement_spec(
            session.name,
            session.spec,
            token_sha256=sha,
            image=image,
            playout=resolve_playout(session, pool),
        )
    except ValueError as exc:
        raise AdmissionFailure(Reason.INVALID_SPEC, str(exc)) from None
