"""TLS where secrets travel (issue 23 item 9), through the real operator, real worker Pods, the cluster's DNS
and a redis-server that speaks TLS only, with certificates of a CA made here: the operator and the workers
reach Redis over `rediss://` verifying its CA (the operator copies the CA into the pool's Secret), a pool with
`spec.tls` serves https at its pods' DNS names under its headless Service and says so in `status.endpoint`,
and the Python client in a Pod ticks it verifying the pool's CA, while one without the CA is refused. The
pod-to-pod pull over https: tests/worker/test_tls.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest

from ardiff.devcluster.pki import CertificateAuthority
from ardiff.devcluster.redis_server import ServerTls
from ardiff.devcluster.waiting import wait_until
from ardiff.operator.pods import CONTAINER_SECURITY_CONTEXT, DEFAULT_POD_SECURITY_CONTEXT
from tests.operator.conftest import Cluster

pytestmark = pytest.mark.slow

# In a Pod of the worker image: the session's client with the pool's CA ticks; one without it is refused.
# It first waits for the worker's DNS name: the record comes from the EndpointSlice the controller-manager
# writes, which a loaded control plane may publish after the session is Ready.
CLIENT = """
import json, os, socket, time
from urllib.parse import urlsplit
from ardiff.client import SessionClient, WorkerUnreachable
endpoint, session, token = os.environ["ENDPOINT"], os.environ["SESSION"], os.environ["TOKEN"]
give_up_at = time.monotonic() + 30
while True:
    try:
        socket.getaddrinfo(urlsplit(endpoint).hostname, None)
        break
    except socket.gaierror:
        if time.monotonic() > give_up_at:
            raise
        time.sleep(0.2)
with SessionClient(session, endpoint, token, ca_file="/etc/pool-ca/ca.crt") as client:
    chunk = client.tick([])
verified = [chunk.metadata.chunk_index, list(chunk.frames.shape)]
try:
    with SessionClient(session, endpoint, token, next_chunk_index=1) as client:
        client.tick([])
    unverified = "ticked"
except WorkerUnreachable as exc:
    unverified = str(exc)
print(json.dumps({"verified": verified, "unverified": unverified}), flush=True)
"""


def tls_secret(name: str, ca: CertificateAuthority, dns_names: list[str]) -> dict:
    """A kubernetes.io/tls Secret as cert-manager writes one: tls.crt, tls.key and ca.crt."""
    pair = ca.issue(name, common_name=name, server=True, dns_names=dns_names)  # a CN holds <= 64 bytes
    data = {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": ca.cert_path}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name},
        "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in data.items()},
    }


def client_pod(session: str, endpoint: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": DEFAULT_POD_SECURITY_CONTEXT,
            "containers": [
                {
                    "name": "client",
                    "image": "ghcr.io/ardiff/ardiff-worker:test",
                    "command": ["python", "-c", CLIENT],
                    "env": [
                        {"name": "ENDPOINT", "value": endpoint},
                        {"name": "SESSION", "value": session},
                        {
                            "name": "TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": f"{session}-token", "key": "token"}},
                        },
                    ],
                    "securityContext": CONTAINER_SECURITY_CONTEXT,
                    "volumeMounts": [{"name": "ca", "mountPath": "/etc/pool-ca", "readOnly": True}],
                }
            ],
            "volumes": [
                {
                    "name": "ca",
                    "secret": {"secretName": "pool-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
                }
            ],
        },
    }


def test_a_tls_pool_on_tls_redis_is_ticked_over_https_at_its_pods_dns_name(
    cluster: Cluster, tmp_path: Path
) -> None:
    ns = cluster.namespace
    network = cluster.kube.network
    assert network is not None
    ca = CertificateAuthority(tmp_path / "ca", common_name="test-ca")
    pair = ca.issue("redis", common_name="redis", server=True, ip_addresses=["127.0.0.1", network.host_ip])
    with cluster.redis_server(tls=ServerTls(pair.cert, pair.key, ca.cert_path)) as redis:
        assert redis.url.startswith("rediss://")
        operator = cluster.operator(redis.url, tmp_path / "operator.log").start()
        try:
            operator.wait_ready()
            secret = tls_secret("pool-tls", ca, [f"*.pool-workers.{ns}.svc.cluster.local"])
            assert cluster.http.post(f"/api/v1/namespaces/{ns}/secrets", json=secret).status_code == 201
            cluster.create_pool(tls={"secretName": "pool-tls"})
            cluster.create_session("walk")
            status = cluster.wait_phase("walk", "Ready", timeout=90)

            # Redis: the workers' URL is rediss:// with the CA the operator copied where their Pods mount it,
            # and they are connected (the server has no plain port).
            workers = cluster.get("secrets", "pool-workers-redis", core=True)
            assert workers is not None
            url = base64.b64decode(workers["data"]["url"]).decode()
            assert url.startswith(f"rediss://ardiff-pool.{ns}.pool:")
            assert url.endswith("?ssl_ca_certs=/etc/ardiff/redis-tls/ca.crt")
            assert base64.b64decode(workers["data"]["ca.crt"]) == ca.cert_path.read_bytes()
            [pod] = cluster.pods()
            pod_ip = pod["status"]["podIP"]
            assert pod_ip in redis.cli("CLIENT", "LIST")

            # The worker: https at its DNS name under the pool's headless Service, nothing in plain HTTP.
            assert status["endpoint"] == f"https://{status['pod']}.pool-workers.{ns}.svc.cluster.local:8000"
            with pytest.raises(httpx.TransportError):
                httpx.get(f"http://{pod_ip}:8000/healthz", timeout=5)

            # The client, in the cluster (its DNS): verifying the pool's CA it ticks; without it, refused.
            created = cluster.http.post(
                f"/api/v1/namespaces/{ns}/pods", json=client_pod("walk", status["endpoint"])
            )
            assert created.status_code == 201, created.text
            wait_until(
                lambda: (
                    (cluster.get("pods", "client", core=True) or {}).get("status", {}).get("phase")
                    in ("Succeeded", "Failed")
                ),
                timeout=60,
                what="the client Pod done",
            )
            log = cluster.pod_log("client")
            results = [line for line in log.splitlines() if line.startswith('{"verified"')]
            assert results, f"the client printed no result:\n{log}"
            result = json.loads(results[-1])
            (chunk_index, shape), refused = result["verified"], result["unverified"]
            assert (chunk_index, shape[1:]) == (0, [64, 64, 3]), log
            assert "CERTIFICATE_VERIFY_FAILED" in refused, log
        finally:
            try:
                cluster.delete_all()
            finally:
                operator.stop()
