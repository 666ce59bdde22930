"""What a benchmark of the whole system runs on: a namespace of a dev cluster with its own Redis, the real
operator and one pool — the benchmark's own dev cluster when run as a script, a test's stack
(`tests/e2e/conftest.py`) in the suite's smoke runs, which share the test session's cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ardiff.client import KubeSessions
from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.pools import pool_pods
from ardiff.devcluster.redis_server import RedisServer


@dataclass(frozen=True)
class BenchTarget:
    """`namespace` of `kube` with its `redis`, its `operator` (serving its metrics at `metrics_url` when it
    was started with `--metrics`) and pool `pool`; `sessions`, the client for that namespace."""

    kube: DevCluster
    namespace: str
    pool: str
    redis: RedisServer
    operator: OperatorProcess
    sessions: KubeSessions
    metrics_url: str | None = None

    def worker_pods(self) -> dict[str, dict[str, Any]]:
        """The pool's worker Pods that are not being deleted, by name."""
        return pool_pods(self.kube.admin, self.namespace, self.pool)

    @classmethod
    def of_cluster(cls, cluster: DevCluster, pool: str, metrics_url: str | None = None) -> BenchTarget:
        """The namespace a started dev cluster serves with its own Redis and operator."""
        assert cluster.redis is not None
        assert cluster.operator is not None
        return cls(
            cluster, cluster.namespace, pool, cluster.redis, cluster.operator, cluster.sessions(), metrics_url
        )
