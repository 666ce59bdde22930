"""The whole local stack as one object: emulated API, Redis, pod runner and (given a command) the operator.

    with DevCluster(Path(".ardiff-dev"), operator_command=["ardiff", "operator", "run", "--standalone"]) as c:
        c.kubectl("apply", "-f", "examples/pool.yaml")

The API runs as its own process (`python -m ardiff.devcluster.kube_api`, so it does not compete with
the caller for the GIL), Redis as `redis-server`, the pod runner on a thread of the caller, the operator as
a process with KUBECONFIG, ARDIFF_REDIS_URL and ARDIFF_WATCH_NAMESPACES set (`operator_process`; `start()`
returns once it serves). Everything writes its log under `<workdir>/logs/` (Pods:
`logs/pods/<namespace>_<pod>.log`); the Pods' emptyDir volumes are under `<workdir>/volumes/`. `stop()`
tears down in reverse order. `ardiff up`/`down` run it in a background process (`ardiff.devcluster.daemon`);
`ardiff demo` and tests/e2e run it in theirs.
This is a development harness; production runs on a real cluster through the Helm chart.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import httpx

from ardiff.devcluster.kubectl import run_kubectl
from ardiff.devcluster.operator_process import OperatorProcess, stop_process
from ardiff.devcluster.pod_runner import PodCommand, PodRunner, container_command
from ardiff.devcluster.redis_server import RedisServer, free_port

if TYPE_CHECKING:
    from ardiff.client import KubeSessions

# The real operator, as `ardiff up` and the demo run it.
OPERATOR_COMMAND = ("ardiff", "operator", "run", "--standalone")
# Interactive periods: statuses (and `kubectl get`'s Chunk column) follow ticks within about a second.
INTERACTIVE_OPERATOR_ENV = {"ARDIFF_OPERATOR_RECONCILE_SECONDS": "1", "ARDIFF_OPERATOR_MIRROR_SECONDS": "1"}
# Benchmark periods: a reconcile round every half second, so rounds add little to what is timed.
BENCHMARK_OPERATOR_ENV = {"ARDIFF_OPERATOR_RECONCILE_SECONDS": "0.5", "ARDIFF_OPERATOR_MIRROR_SECONDS": "1"}


def tiny_pool(
    name: str,
    *,
    min_replicas: int,
    max_replicas: int,
    scale_down_delay_seconds: int,
    capacity: int = 2,
    env: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A pool of workers on the embedded tiny LingBot-World at 64x64, `capacity` sessions per pod, evicting
    idle sessions at once (the benchmarks' and the e2e tests' pool; `env` may make its workers fake)."""
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
            "image": "ghcr.io/ardiff/ardiff-worker:0.1.0",
            # 1 GiB of "free device memory" on CPU keeps each worker's KV pool small.
            "kv": {"sessionCapacity": capacity, "cpuFreeMemoryBytes": 1 << 30},
            **({"env": [dict(item) for item in env]} if env else {}),
            "replicas": {"min": min_replicas, "max": max_replicas},
            "scaleDownDelaySeconds": scale_down_delay_seconds,
            "eviction": {"minIdleSeconds": 0},
        },
    }


@dataclass
class KubeAPIProcess:
    """`python -m ardiff.devcluster.kube_api` on a free port; `url` and `kubeconfig` once started."""

    kubeconfig: Path
    log_path: Path
    install_crds: bool = True
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> Self:
        self.kubeconfig.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "ardiff.devcluster.kube_api", "--port", str(self.port)]
        argv += ["--kubeconfig", str(self.kubeconfig), *(["--install-crds"] if self.install_crds else [])]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while not self.kubeconfig.exists():  # written once the API listens (and the CRDs are in)
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the dev cluster API exited with {self.process.returncode}; see {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"the dev cluster API did not start within {timeout}s; see {self.log_path}"
                )
            time.sleep(0.05)
        httpx.get(f"{self.url}/readyz", timeout=5).raise_for_status()
        return self

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None


@dataclass
class DevCluster:
    """API + Redis + pod runner (+ operator); see the module docstring."""

    workdir: Path
    operator_command: Sequence[str] | None = None
    namespace: str = "default"
    install_crds: bool = True  # False: the caller installs them (as `helm install` does from the chart)
    pod_command: PodCommand = container_command
    pod_env: Mapping[str, str] = field(default_factory=dict)
    operator_env: Mapping[str, str] = field(default_factory=dict)
    simulated_pods: bool = False  # worker Pods without processes (pod_runner's simulated mode)
    redis: RedisServer | None = None
    api: KubeAPIProcess | None = None
    runner: PodRunner | None = None
    operator: OperatorProcess | None = None

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def redis_url(self) -> str:
        assert self.redis is not None, "the dev cluster is not started"
        return self.redis.url

    @property
    def api_url(self) -> str:
        assert self.api is not None, "the dev cluster is not started"
        return self.api.url

    def start(self) -> Self:
        """Start every part; on a failure the parts already started are stopped again."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.redis = RedisServer().start()
            self.api = KubeAPIProcess(
                self.kubeconfig, self.logs_dir / "kube-api.log", install_crds=self.install_crds
            ).start()
            if self.namespace != "default":
                namespace = {"metadata": {"name": self.namespace}}
                httpx.post(f"{self.api.url}/api/v1/namespaces", json=namespace, timeout=10).raise_for_status()
            self.runner = PodRunner(
                self.api.url,
                command=self.pod_command,
                logs_dir=self.logs_dir / "pods",
                volumes_dir=self.workdir / "volumes",
                extra_env=self.pod_env,
                simulated=self.simulated_pods,
            ).start()
            if self.operator_command is not None:
                self.operator = OperatorProcess(
                    self.operator_command,
                    kubeconfig=self.kubeconfig,
                    redis_url=self.redis.url,
                    namespace=self.namespace,
                    log_path=self.logs_dir / "operator.log",
                    env=self.operator_env,
                ).start()
                self.operator.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl against this cluster, in its namespace unless `args` name one."""
        namespaced = any(a in ("-n", "--namespace", "-A", "--all-namespaces") for a in args)
        prefix = [] if namespaced else ["-n", self.namespace]
        return run_kubectl([*prefix, *args], kubeconfig=self.kubeconfig, stdin=stdin, check=check)

    def stop(self) -> None:
        """Operator first (it must not see Pods vanish), then Pods, the API and Redis."""
        if self.operator is not None:
            self.operator.stop()
            self.operator = None
        if self.runner is not None:
            self.runner.stop()
            self.runner = None
        if self.api is not None:
            self.api.stop()
            self.api = None
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def sessions(self) -> KubeSessions:
        """The Python client's Kubernetes part, for this cluster's namespace."""
        from ardiff.client import KubeSessions

        return KubeSessions(self.namespace, kubeconfig=self.kubeconfig)

    def processes(self) -> list[int]:
        """The pids of every process the cluster runs now: API, Redis, operator and worker Pods."""
        candidates = [
            self.api.process.pid if self.api is not None and self.api.process is not None else None,
            self.redis.process.pid if self.redis is not None and self.redis.process is not None else None,
            self.operator.pid if self.operator is not None else None,
            *(info.pid for info in (self.runner.pods() if self.runner is not None else [])),
        ]
        return sorted(pid for pid in candidates if pid is not None)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
