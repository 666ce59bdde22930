"""TLS between a pool's pods and to their clients (issue 23 item 9; docs/contracts.md §10), the worker's part:
real worker processes serve https with a certificate of a CA made here and advertise their https endpoint; a
migrated session is offered and pulled pod to pod over https, verified against the pool's CA; a pod that
trusts another CA cannot pull it (the shared tier's copy serves instead); plain http and a client without the
CA get nothing. The cluster's part (the operator's Pods, DNS names, the client): tests/operator/test_tls.py.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import uuid
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from ardiff.devcluster.pki import CertificateAuthority, KeyPair
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.records import PoolId
from tests.worker.conftest import launch_fake_pod, suspend_and_wait
from tests.worker.test_continuity import frames_of, metric
from tests.worker.test_http_contract import wait_for

POOL = PoolId("default", f"wk-tls-{uuid.uuid4().hex[:6]}")
TOKEN = "tls-token"
PODS = ("tls-a", "tls-b", "tls-c")
PULLED = 'ardiff_session_transfers_total{direction="in",result="ok"}'
PULL_FAILED = 'ardiff_session_transfers_total{direction="in",result="failed"}'


@pytest.fixture(scope="module")
def pki(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[CertificateAuthority, CertificateAuthority, KeyPair]:
    """The pool's CA, another CA, and the pool's certificate (for `localhost`, where the test's pods are)."""
    directory = tmp_path_factory.mktemp("tls")
    ca = CertificateAuthority(directory / "pool", common_name="pool-ca")
    other = CertificateAuthority(directory / "other", common_name="other-ca")
    return ca, other, ca.issue("worker", common_name="localhost", server=True, dns_names=["localhost"])


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-tier")


def launch(launch_worker, redis_url, tier, pki, pod: str, *, trusts: CertificateAuthority, pair: KeyPair):
    """A pod of the pool serving https with `pair` (of the pool's CA), verifying its peers against `trusts`
    (the test's client verifies it against the pool's CA)."""
    ca, _, _ = pki
    return launch_fake_pod(
        launch_worker,
        redis_url,
        POOL,
        pod,
        suspend_dir=str(tier),
        tls_cert_file=str(pair.cert),
        tls_key_file=str(pair.key),
        tls_ca_file=str(trusts.cert_path),
        client_ca_file=str(ca.cert_path),
    )


@pytest.fixture(scope="module")
def pods(launch_worker, redis_url, tier, pki):
    """A and B trust the pool's CA; C trusts another one and has its own copy of the pool's certificate."""
    ca, other, pair = pki
    workers = {
        pod: launch(launch_worker, redis_url, tier, pki, pod, trusts=ca, pair=pair) for pod in PODS[:2]
    }
    own = tier.parent / "tls-c"
    own.mkdir()
    copy = KeyPair(Path(shutil.copy(pair.cert, own)), Path(shutil.copy(pair.key, own)))
    workers["tls-c"] = launch(launch_worker, redis_url, tier, pki, "tls-c", trusts=other, pair=copy)
    yield workers
    for worker in workers.values():
        worker.stop()


async def reaches(worker, sample: str, value: float) -> None:
    async def reached() -> bool:
        return metric(worker, sample) == value

    await wait_for(reached)


async def place_on(store, spec, pod: str):
    """Place as the operator does, with the other pods drained for the moment."""
    others = [p for p in PODS if p != pod]
    for other in others:
        await store.set_draining(POOL, other, draining=True)
    try:
        placed = await store.place(POOL, spec)
    finally:
        for other in others:
            await store.set_draining(POOL, other, draining=False)
    assert placed.placement is not None
    assert placed.placement.pod == pod


@pytest.fixture
async def on_a(pods, store, session_spec):
    names: list[str] = []

    async def place() -> str:
        name = f"s-{uuid.uuid4().hex[:8]}"
        await place_on(store, session_spec(name, TOKEN, seed=5), "tls-a")
        names.append(name)
        return name

    yield place
    for name in names:
        await store.release(POOL, name, reason="test done")


def test_a_pod_serves_https_only_to_clients_that_verify_the_pools_ca(pods) -> None:
    a = pods["tls-a"]
    assert a.url.startswith("https://localhost:")
    assert a.client.get(f"{a.url}/healthz").status_code == 200
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{a.url}/healthz")  # the system's CAs do not know the pool's
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{a.port}/healthz")  # no plain HTTP beside https


async def test_a_migration_is_offered_and_pulled_over_https_verified_by_the_pools_ca(pods, store, on_a):
    a, b = pods["tls-a"], pods["tls-b"]
    assert (await store.get_pod(POOL, "tls-a")).endpoint == a.url  # what clients and peers are told
    session = await on_a()
    for i in range(2):
        frames_of(a.tick(session, i, token=TOKEN))
    record = await suspend_and_wait(store, POOL, session, reason="migrate")
    await place_on(store, record.spec(), "tls-b")

    await reaches(b, PULLED, 1)  # offered by A over https, then pulled by B over https
    note = json.loads((await store.get_session(POOL, session)).resumed_note)
    assert (note["source"], note["from"], note["to"], note["direct_failed"]) == (
        "direct",
        "tls-a",
        "tls-b",
        False,
    )
    frames_of(b.tick(session, 2, token=TOKEN))


async def test_a_pod_that_trusts_another_ca_pulls_nothing_from_the_pool_and_reads_the_shared_tier(
    pods, store, on_a
):
    a, c = pods["tls-a"], pods["tls-c"]
    sent = metric(a, 'ardiff_session_transfers_total{direction="out",result="ok"}')
    session = await on_a()
    for i in range(2):
        frames_of(a.tick(session, i, token=TOKEN))
    record = await suspend_and_wait(store, POOL, session, reason="migrate")
    await place_on(store, record.spec(), "tls-c")

    frames_of(c.tick(session, 2, token=TOKEN))  # its first tick resumes it (the offered pull failed too)
    assert metric(c, 'ardiff_session_resumes_total{source="suspend"}') == 1
    note = json.loads((await store.get_session(POOL, session)).resumed_note)
    assert (note["source"], note["to"], note["direct_failed"]) == ("suspend", "tls-c", True)
    assert (metric(c, PULL_FAILED), metric(c, PULLED)) == (1, 0)
    assert metric(a, 'ardiff_session_transfers_total{direction="out",result="ok"}') == sent  # nothing sent
    assert "CERTIFICATE_VERIFY_FAILED" in c.log()
    frames_of(c.tick(session, 3, token=TOKEN))


def test_a_renewed_certificate_serves_the_next_connections_without_a_restart(pods, pki) -> None:
    """cert-manager renews the Secret and the kubelet swaps the mounted files: the worker loads them (its
    check every few seconds), so a certificate never expires under a pod that lives longer than it."""
    ca, _, _ = pki
    c = pods["tls-c"]
    renewed = ca.issue("renewed", common_name="localhost", server=True, dns_names=["localhost"])
    serial = x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number

    def served() -> int:
        pem = ssl.get_server_certificate(("127.0.0.1", c.port))
        return x509.load_pem_x509_certificate(pem.encode()).serial_number

    assert served() != serial
    for new, path in (
        (renewed.key, c.env["ARDIFF_TLS_KEY_FILE"]),
        (renewed.cert, c.env["ARDIFF_TLS_CERT_FILE"]),
    ):
        shutil.copy(new, f"{path}.new")
        os.replace(f"{path}.new", path)
    wait_until(lambda: served() == serial, timeout=20, what="the renewed certificate served")
    assert c.client.get(f"{c.url}/healthz").status_code == 200  # verified against the pool's CA
    assert c.process is not None
    assert c.process.poll() is None  # the same process
