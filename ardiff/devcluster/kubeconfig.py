"""Kubeconfig files and HTTP clients for the dev cluster's identities (client certificates or tokens).

One place says how a credential becomes a kubeconfig (for kubectl, helm, kopf and the `kubernetes` client) and
an `httpx` client (for the harness itself: the kubelets, the tests' helpers, the demo).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from ardiff.devcluster.pki import KeyPair


@dataclass(frozen=True)
class Credentials:
    """Who a client is on the API server at `server`: a client certificate, or a bearer token."""

    server: str
    ca: Path
    user: str
    certificate: KeyPair | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if (self.certificate is None) == (self.token is None):
            raise ValueError(
                f"credentials of {self.user} need exactly one of a client certificate or a token"
            )

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        user: dict[str, str] = (
            {"client-certificate": str(self.certificate.cert), "client-key": str(self.certificate.key)}
            if self.certificate is not None
            else {"token": self.token or ""}
        )
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "ardiff-dev",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": self.user, "user": user}],
            "contexts": [
                {
                    "name": self.user,
                    "context": {"cluster": "ardiff-dev", "user": self.user, "namespace": namespace},
                }
            ],
            "current-context": self.user,
        }

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        path.chmod(0o600)
        return path

    def ssl_context(self) -> ssl.SSLContext:
        """Verifies the server against the cluster's CA and presents the client certificate, if any."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.certificate is not None:
            context.load_cert_chain(str(self.certificate.cert), str(self.certificate.key))
        return context

    def _httpx_options(self, timeout: float) -> dict[str, Any]:
        options: dict[str, Any] = {"base_url": self.server, "verify": self.ssl_context(), "timeout": timeout}
        if self.token is not None:
            options["headers"] = {"Authorization": f"Bearer {self.token}"}
        return options

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(**self._httpx_options(timeout))

    def async_client(self, timeout: float = 30) -> httpx.AsyncClient:
        return httpx.AsyncClient(**self._httpx_options(timeout))


def credentials_from_kubeconfig(path: Path) -> Credentials:
    """The credentials of a kubeconfig this module wrote (its current context)."""
    config = yaml.safe_load(path.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    pair = (
        KeyPair(Path(user["client-certificate"]), Path(user["client-key"])) if "client-key" in user else None
    )
    return Credentials(
        server=cluster["server"],
        ca=Path(cluster["certificate-authority"]),
        user=context["user"],
        certificate=pair,
        token=user.get("token"),
    )
