"""The bundled Envoy's clusters to TLS pools (issue 37): one per pool whose pods serve https, trusting the
pool's CA, kept by the endpoint picker in the directory Envoy watches (`ardiff.gateway.envoy_config`).

Pools come and go and their CAs rotate, so the clusters are not in the bootstrap: the operator writes each
pool's CA into the pool's record in the store (`PlacementStore.write_pool`), every route read carries the CA's
digest, and the first request for a pool (or for a new CA) makes the picker fetch the PEM, write it beside
the other pools' and rewrite the cluster file (renamed into place: Envoy reloads it). The picker then waits,
briefly, until Envoy's admin interface lists the cluster, so that the request it forwards finds it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path

import httpx

from ardiff.gateway.envoy_config import tls_cluster_name, write_tls_clusters
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId

log = logging.getLogger(__name__)

# How long a request waits for Envoy to load a pool's new cluster (it reloads a renamed file at once).
LOAD_WAIT_SECONDS = 2.0
LOAD_POLL_SECONDS = 0.02


class TlsClusters:
    """The TLS pools' clusters in `directory` (CA files under `ca/`, the cluster file beside), and Envoy's
    admin interface at `envoy_admin` (`host:port`; None: no wait for the load)."""

    def __init__(self, directory: Path, envoy_admin: str | None = None) -> None:
        self.directory = directory
        self.envoy_admin = envoy_admin
        self._clusters: dict[tuple[str, str], str] = {}  # (namespace, pool) -> its cluster's name
        self._ca_files: dict[str, str] = {}  # cluster name -> the CA file it trusts
        self._lock = asyncio.Lock()

    async def cluster(self, store: PlacementStore, pool: PoolId, ca_sha256: str) -> str | None:
        """The name of the cluster that trusts the pool's CA (its digest as `store` holds it), made first
        when it is new; None when the pool has no CA."""
        key = (pool.namespace, pool.name)
        name = tls_cluster_name(pool.namespace, pool.name, ca_sha256)
        if not ca_sha256 or self._clusters.get(key) == name:
            return name if ca_sha256 else None
        async with self._lock:
            if self._clusters.get(key) != name:
                pem = await store.pool_ca(pool)
                if hashlib.sha256(pem.encode()).hexdigest() != ca_sha256:
                    return None  # the CA changed again meanwhile: the next request reads the new digest
                ca_dir = self.directory / "ca"
                ca_dir.mkdir(parents=True, exist_ok=True)
                ca_file = ca_dir / f"{name}.crt"
                ca_file.write_text(pem)
                self._ca_files.pop(self._clusters.get(key, ""), None)  # the old CA's cluster goes
                self._ca_files[name] = str(ca_file)
                await asyncio.to_thread(write_tls_clusters, self.directory, self._ca_files)
                self._clusters[key] = name
                log.info("cluster %s trusts pool %s/%s's CA", name, *key)
                await self._loaded(name)
        return name

    async def _loaded(self, cluster: str) -> None:
        """Wait until Envoy lists `cluster` (at most `LOAD_WAIT_SECONDS`)."""
        if self.envoy_admin is None:
            return
        deadline = time.monotonic() + LOAD_WAIT_SECONDS
        async with httpx.AsyncClient(timeout=1.0) as admin:
            while time.monotonic() < deadline:
                try:
                    listed = await admin.get(f"http://{self.envoy_admin}/clusters")
                    if f"\n{cluster}::" in f"\n{listed.text}":
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(LOAD_POLL_SECONDS)
        log.warning("Envoy did not list cluster %s within %.0f s", cluster, LOAD_WAIT_SECONDS)
