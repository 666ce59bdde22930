"""A real Kubernetes control plane on this machine: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, built from their Go modules (`ardiff.devcluster.binaries`), in the network namespace of the
slot's control-plane host (`ardiff.devcluster.network`).

`ControlPlane.start()` makes the certificates (`pki`), starts etcd (loopback, no fsync), the API server
(secure serving on 10.K.0.2:6443, `Node,RBAC` authorization, service-account issuer and keys, the default
admission plugins plus NodeRestriction and OwnerReferencesPermissionEnforcement), then the controller-manager
(every controller, each with its own service account) and the scheduler, and returns once `/readyz` is ok and
the controller-manager has made the `default` service account. Credentials: `admin` (a `system:masters`
certificate), `node_credentials(name)` (a kubelet's `system:node:<name>`), `service_account_token(...)`.
`stop()` ends them in reverse order; everything lives under `workdir` (pki/, etcd/, logs/).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from ardiff.devcluster.binaries import KubernetesBinaries
from ardiff.devcluster.kubeconfig import Credentials
from ardiff.devcluster.network import ClusterNetwork
from ardiff.devcluster.pki import CertificateAuthority, KeyPair, service_account_keys

API_PORT = 6443
ETCD_PORT = 2379
ETCD_URL = f"http://127.0.0.1:{ETCD_PORT}"  # in the control plane's network namespace only
CLUSTER_DOMAIN = "cluster.local"
SERVICE_ACCOUNT_ISSUER = f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}"
# The audit log keeps what service accounts outside kube-system ask (at Metadata level: who, verb, resource,
# answer): the tests derive the least-privilege Roles from it. Nothing else is logged.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},  # the controllers, add-ons
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}
STOP_SECONDS = 15.0


class ControlPlaneError(RuntimeError):
    """A component did not start; the message names its log."""


@dataclass
class ComponentProcess:
    """One control-plane binary, run in a network namespace with its output in `log_path`."""

    name: str
    argv: Sequence[str]
    namespace: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = ["nsenter", f"--net=/run/netns/{self.namespace}", "--", *self.argv]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        return self

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise ControlPlaneError(
                f"{self.name} exited with {self.process.returncode}; see {self.log_path}:\n{self.tail()}"
            )

    def tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL, then wait: a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.process = None
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


@dataclass
class ControlPlane:
    """See the module docstring."""

    workdir: Path
    network: ClusterNetwork
    binaries: KubernetesBinaries
    etcd_quota_bytes: int = 4 << 30
    # The controller-manager's client rate: the defaults (20/s, burst 30) make a namespace's deletion or the
    # garbage collector crawl when a test deletes hundreds of objects at once.
    controller_qps: int = 100
    extra_api_args: Sequence[str] = ()
    components: list[ComponentProcess] = field(default_factory=list)
    ca: CertificateAuthority | None = None
    admin: Credentials | None = None
    _api_flags: list[str] = field(default_factory=list)  # every API server's (see `_api_server`)

    @property
    def server(self) -> str:
        return f"https://{self.network.control_plane_ip}:{API_PORT}"

    @property
    def pki_dir(self) -> Path:
        return self.workdir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one `audit.k8s.io/v1` Event per request of a service account."""
        return self.logs_dir / "audit.log"

    def _issue_client(self, name: str, user: str, groups: Sequence[str] = ()) -> Credentials:
        assert self.ca is not None
        pair = self.ca.issue(name, common_name=user, organizations=groups, client=True)
        return Credentials(server=self.server, ca=self.ca.cert_path, user=user, certificate=pair)

    def node_credentials(self, node: str) -> Credentials:
        """A kubelet's client certificate: user `system:node:<node>` in group `system:nodes`."""
        return self._issue_client(f"kubelet-{node}", f"system:node:{node}", ["system:nodes"])

    def kubelet_serving(self, node: str, address: str) -> KeyPair:
        """The serving certificate of a kubelet's API (the API server checks it against the CA)."""
        assert self.ca is not None
        return self.ca.issue(
            f"kubelet-{node}-serving",
            common_name=f"system:node:{node}",
            server=True,
            dns_names=[node],
            ip_addresses=[address],
        )

    # --- lifecycle -----------------------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> Self:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self.workdir = self.workdir.resolve()  # kubeconfigs and flags name files by absolute path
        ns = self.network.add_control_plane()
        self.ca = CertificateAuthority(self.pki_dir)
        cp_ip = self.network.control_plane_ip
        serving = self.ca.issue(
            "apiserver",
            common_name="kube-apiserver",
            server=True,
            dns_names=[
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
                "localhost",
            ],
            ip_addresses=[cp_ip, self.network.api_service_ip, "127.0.0.1"],
        )
        kubelet_client = self.ca.issue(
            "apiserver-kubelet-client",
            common_name="kube-apiserver-kubelet-client",
            organizations=["kubeadm:cluster-admins"],
            client=True,
        )
        sa = service_account_keys(self.pki_dir)
        # The aggregation layer's front proxy (kubeadm makes the same): without its CA in
        # extension-apiserver-authentication every component that delegates authentication logs errors.
        front_proxy = CertificateAuthority(self.pki_dir / "front-proxy", common_name="ardiff-front-proxy-ca")
        front_proxy_client = front_proxy.issue(
            "front-proxy-client", common_name="front-proxy-client", client=True
        )
        self.admin = self._issue_client("admin", "kubernetes-admin", ["system:masters"])
        controller_manager = self._issue_client("controller-manager", "system:kube-controller-manager")
        scheduler = self._issue_client("scheduler", "system:kube-scheduler")
        audit_policy = self.workdir / "audit-policy.json"
        audit_policy.write_text(json.dumps(AUDIT_POLICY))
        kcm_config = controller_manager.write_kubeconfig(self.workdir / "controller-manager.kubeconfig")
        scheduler_config = scheduler.write_kubeconfig(self.workdir / "scheduler.kubeconfig")
        ca = str(self.ca.cert_path)

        etcd = ComponentProcess(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=ardiff-dev",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={ETCD_URL}",
                f"--advertise-client-urls={ETCD_URL}",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=ardiff-dev=http://127.0.0.1:2380",
                "--unsafe-no-fsync",
                f"--quota-backend-bytes={self.etcd_quota_bytes}",
                "--log-level=warn",
            ],
            ns,
            self.logs_dir / "etcd.log",
        ).start()
        self.components.append(etcd)
        self._api_flags = [
            f"--bind-address={cp_ip}",
            f"--advertise-address={cp_ip}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={ca}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={ca}",
            "--kubelet-preferred-address-types=InternalIP",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
            f"--service-cluster-ip-range={self.network.service_cidr}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={sa.cert}",
            f"--service-account-signing-key-file={sa.key}",
            "--allow-privileged=true",
            f"--requestheader-client-ca-file={front_proxy.cert_path}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-username-headers=X-Remote-User",
            f"--proxy-client-cert-file={front_proxy_client.cert}",
            f"--proxy-client-key-file={front_proxy_client.key}",
            "--profiling=false",
            "--v=1",
            *self.extra_api_args,
        ]
        apiserver = self._api_server(
            "kube-apiserver",
            etcd=ETCD_URL,
            port=API_PORT,
            flags=[
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=200",
                "--audit-log-mode=batch",
                "--audit-log-batch-max-wait=1s",
            ],
        ).start()
        self.components.append(apiserver)
        self._wait_ready(timeout)
        controller_manager_process = ComponentProcess(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                *self._client_flags(kcm_config),
                "--controllers=*",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa.key}",
                f"--root-ca-file={ca}",
                f"--cluster-signing-cert-file={ca}",
                f"--cluster-signing-key-file={self.ca.pair.key}",
                f"--service-cluster-ip-range={self.network.service_cidr}",
                f"--cluster-cidr={self.network.cluster_cidr}",
                "--allocate-node-cidrs=true",
                "--node-cidr-mask-size=22",
            ],
            ns,
            self.logs_dir / "kube-controller-manager.log",
        ).start()
        self.components.append(controller_manager_process)
        scheduler_process = ComponentProcess(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                *self._client_flags(scheduler_config),
            ],
            ns,
            self.logs_dir / "kube-scheduler.log",
        ).start()
        self.components.append(scheduler_process)
        self._wait_default_service_account(timeout)

    def _api_server(self, name: str, *, etcd: str, port: int, flags: Sequence[str]) -> ComponentProcess:
        """A kube-apiserver (not started) on `etcd`, serving on the control plane's address at `port`."""
        argv = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={etcd}",
            f"--secure-port={port}",
            *self._api_flags,
            *flags,
        ]
        return ComponentProcess(
            name, argv, self.network.control_plane_namespace, self.logs_dir / f"{name}.log"
        )

    def start_api_server(self, name: str, *, etcd: str, port: int, timeout: float = 60) -> ComponentProcess:
        """Another API server of this cluster, on `etcd` (e.g. a link to this one's: the fault injector's
        stale view), at `https://<control plane>:<port>`, started and ready; `stop()` it. It leaves the
        `kubernetes` Service's endpoints to the first one: in-cluster clients never reach it."""
        process = self._api_server(name, etcd=etcd, port=port, flags=["--endpoint-reconciler-type=none"])
        process.start()
        try:
            self._wait_ready(timeout, f"https://{self.network.control_plane_ip}:{port}")
        except BaseException:
            process.stop()
            raise
        return process

    def restart_etcd(self, timeout: float = 60) -> None:
        """Kill etcd (SIGKILL: a crash) and start it again on its data; returns once the API server is ready
        on it again."""
        (etcd,) = [component for component in self.components if component.name == "etcd"]
        etcd.kill()
        etcd.start()
        self._wait_ready(timeout)

    def _client_flags(self, kubeconfig: Path) -> list[str]:
        """What the controller-manager and the scheduler share: their own credentials for the API and for
        authenticating and authorizing their own endpoints (delegated to the API server), their address, their
        client rate, no leader election (one of each)."""
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={self.network.control_plane_ip}",
            f"--kube-api-qps={self.controller_qps}",
            f"--kube-api-burst={2 * self.controller_qps}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ]

    def _wait_ready(self, timeout: float, server: str | None = None) -> None:
        """Until the API server at `server` (the first one's by default) answers `/readyz`."""
        assert self.admin is not None
        deadline = time.monotonic() + timeout
        last = ""
        admin = self.admin if server is None else dataclasses.replace(self.admin, server=server)
        with admin.client(timeout=5) as client:
            while time.monotonic() < deadline:
                for component in self.components:
                    component.check_running()
                try:
                    reply = client.get("/readyz")
                    if reply.status_code == 200:
                        return
                    last = reply.text[-500:]
                except httpx.HTTPError as exc:
                    last = str(exc)
                time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-apiserver {server or self.server} was not ready within {timeout}s: {last}"
        )

    def _wait_default_service_account(self, timeout: float) -> None:
        """The service-account controller's first act: before it, no Pod can be created in `default`."""
        assert self.admin is not None
        deadline = time.monotonic() + timeout
        with self.admin.client(timeout=5) as client:
            while time.monotonic() < deadline:
                for component in self.components:
                    component.check_running()
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200:
                        return
                time.sleep(0.2)
        raise ControlPlaneError(f"no default service account within {timeout}s; see {self.logs_dir}")

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()

    # --- credentials ---------------------------------------------------------------------------------------

    def service_account_token(
        self, namespace: str, name: str, *, audiences: Sequence[str] = (), seconds: int = 86400
    ) -> str:
        """A TokenRequest for a service account (what `kubectl create token` asks for)."""
        assert self.admin is not None
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds, **({"audiences": list(audiences)} if audiences else {})},
        }
        with self.admin.client() as client:
            reply = client.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", json=body)
            reply.raise_for_status()
            return reply.json()["status"]["token"]

    def service_account_credentials(self, namespace: str, name: str) -> Credentials:
        assert self.ca is not None
        return Credentials(
            server=self.server,
            ca=self.ca.cert_path,
            user=f"system:serviceaccount:{namespace}:{name}",
            token=self.service_account_token(namespace, name),
        )

    def apply(self, objects: Sequence[Mapping[str, Any]], field_manager: str = "ardiff-devcluster") -> None:
        """Server-side apply of `objects` as the admin (what `kubectl apply --server-side` does)."""
        assert self.admin is not None
        with self.admin.client() as client:
            for obj in objects:
                reply = client.patch(
                    object_path(obj),
                    params={"fieldManager": field_manager, "force": "true"},
                    content=json.dumps(obj),
                    headers={"Content-Type": "application/apply-patch+yaml"},
                )
                if reply.status_code >= 400:
                    raise ControlPlaneError(f"applying {obj['kind']} {obj['metadata']['name']}: {reply.text}")


# Resources the harness applies, and their plural names (no discovery needed for a fixed set).
_PLURALS = {
    "Namespace": "namespaces",
    "ServiceAccount": "serviceaccounts",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Service": "services",
    "Deployment": "deployments",
    "DaemonSet": "daemonsets",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "CustomResourceDefinition": "customresourcedefinitions",
    "StorageClass": "storageclasses",
}
_CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "StorageClass",
}


def object_path(obj: Mapping[str, Any]) -> str:
    """The REST path of a (known-kind) object."""
    api_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = "" if kind in _CLUSTER_SCOPED else f"/namespaces/{meta.get('namespace', 'default')}"
    return f"{prefix}{scope}/{_PLURALS[kind]}/{meta['name']}"
