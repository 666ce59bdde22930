"""A session's bearer token: made once, kept in a Secret owned by the session; Redis sees only its hash."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import Any

TOKEN_KEY = "token"


def token_secret_name(session: str) -> str:
    return f"{session}-token"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def build_token_secret(namespace: str, session: str, token: str) -> dict[str, Any]:
    """The Secret `<session>-token` (not yet adopted: the handler makes the session its owner)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": token_secret_name(session),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "ardiff", "ardiffusion.dev/session": session},
        },
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def read_token(secret: Mapping[str, Any]) -> str:
    """The token stored in a Secret built by `build_token_secret` (or edited to hold `stringData`)."""
    string_data = secret.get("stringData") or {}
    if TOKEN_KEY in string_data:
        return str(string_data[TOKEN_KEY])
    encoded = (secret.get("data") or {}).get(TOKEN_KEY)
    if not encoded:
        raise ValueError(f"secret {secret['metadata']['name']} has no key {TOKEN_KEY!r}")
    return base64.b64decode(encoded).decode()
