"""The placement store: which pod holds which session, in Redis (DESIGN §3.2, docs/contracts.md §2).

`PlacementStore` is the one store every caller holds: the worker's operations (`placement_worker`), the
operator's (`placement_operator`), the ones they share (`placement_shared`) and the front door's read
(`placement_gateway`), over the script runner (`scripts`: plans, WAIT) and a client built from a URL
(`connection`). This module only joins them and reads the store's options from a URL.
"""

from __future__ import annotations

from typing import Any

from ardiff.kv.connection import SENTINEL_WAIT_REPLICAS, build_redis_client, split_url_options
from ardiff.kv.placement_gateway import GatewayPlacement
from ardiff.kv.placement_operator import OperatorPlacement
from ardiff.kv.placement_worker import WorkerPlacement


class PlacementStore(WorkerPlacement, OperatorPlacement, GatewayPlacement):
    """Async placement store over one Redis (standalone, TLS, Sentinel-managed) or a Redis Cluster (every key
    of a pool shares the pool's hash tag, so each script runs on the one node that owns the pool's slot).

    Options: `closed_ttl_ms`, `stream_maxlen` (`OperatorPlacement`), `wait_replicas`, `wait_timeout_ms`
    (`ScriptRunner`: every write but `touch` waits for that many replicas, `NotReplicated` when fewer
    acknowledge; not on a Cluster). `from_url` turns WAIT on for Sentinel URLs: docs/contracts.md §2
    "Failover" has the decision, docs/benchmarks.md its cost."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PlacementStore:
        """A store for `url` (see `build_redis_client`); its query may set `wait_replicas` and
        `wait_timeout_ms` (keyword `options` win). A `redis+sentinel://` URL names a replicated deployment:
        its writes wait for one replica unless the URL says `wait_replicas=0`."""
        redis_url, url_options = split_url_options(url)
        if redis_url.startswith("redis+sentinel://"):
            url_options.setdefault("wait_replicas", SENTINEL_WAIT_REPLICAS)
        return cls(build_redis_client(redis_url), **{**url_options, **options})
