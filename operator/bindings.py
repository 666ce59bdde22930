"""The part of a session's Redis record that its status mirrors, read for a whole pool in one round trip.

`PlacementStore.get_sessions` returns whole records, `image` (up to 4 MiB) and prompt included; a pool's
reconcile reads every session every few seconds, so it reads only these fields (HMGET, pipelined). This
reads the store's keys directly through its key builder (`ardiff.kv.keys`), and nothing else: a read-only
workaround until the store offers such a read itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState

FIELDS = ("state", "pod", "pod_epoch", "reset_required", "chunk_index", "last_tick_ms")


class SessionPlacement(Protocol):
    """What status derivation needs of a session's record (a `SessionRecord` has it too)."""

    @property
    def state(self) -> SessionState: ...
    @property
    def pod(self) -> str: ...
    @property
    def pod_epoch(self) -> int: ...
    @property
    def reset_required(self) -> bool: ...
    @property
    def chunk_index(self) -> int: ...
    @property
    def last_tick_ms(self) -> int: ...


@dataclass(frozen=True)
class SessionBinding:
    name: str
    state: SessionState
    pod: str
    pod_epoch: int
    reset_required: bool
    chunk_index: int
    last_tick_ms: int


def _int(raw: bytes | None) -> int:
    return int(raw) if raw else 0


async def read_bindings(
    store: PlacementStore, pool: PoolId, names: Iterable[str]
) -> dict[str, SessionBinding]:
    """The bindings of `names` that have a record (one pipelined round trip)."""
    keys = PoolKeys(pool)
    names = list(names)
    async with store.client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hmget(keys.session(name), FIELDS)
        replies = await pipe.execute()
    bindings = {}
    for name, (state, pod, epoch, reset, chunk, last_tick) in zip(names, replies, strict=True):
        if state is None:
            continue
        bindings[name] = SessionBinding(
            name=name,
            state=SessionState(state.decode()),
            pod=pod.decode() if pod else "",
            pod_epoch=_int(epoch),
            reset_required=_int(reset) == 1,
            chunk_index=_int(chunk),
            last_tick_ms=_int(last_tick),
        )
    return bindings
