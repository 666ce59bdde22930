"""A session's spec changed after its admission, applied by each pool round (issue 40 item 4).

What a session is placed with is written into its placement record once, at admission; of the fields a user
may change afterwards (the CRD makes `poolRef`, `family`, `forkFrom`, `prompt`, `seed`, `image`,
`maxChunks` and `playout` immutable), `priority` and `evictionPolicy` decide who is evicted for whom, so the
round writes a changed one into the record and the LRU index (`PlacementStore.set_eviction`).
Level-triggered: the round compares the spec with the record it read, so a change made while no operator ran
is applied by the next one. `idleTimeoutSeconds` is read from the spec itself by every round; `history` when
the session is placed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from ardiff.kv.errors import UnknownSession
from ardiff.kv.records import PoolId, SessionBinding, SessionState
from ardiff.operator.context import OperatorContext
from ardiff.operator.views import SessionView


async def apply_eviction_specs(
    ctx: OperatorContext,
    pool: PoolId,
    sessions: Sequence[SessionView],
    records: Mapping[str, SessionBinding],
) -> list[str]:
    """Write each session's spec'd priority and eviction policy where its record holds others; the names
    written."""
    written = []
    for session in sessions:
        record, spec = records.get(session.name), session.spec
        if record is None or spec is None or record.state is SessionState.CLOSED:
            continue
        if (record.priority, record.eviction_policy) == (spec.priority, spec.eviction_policy):
            continue
        with contextlib.suppress(UnknownSession):  # released meanwhile: nothing to keep
            await ctx.store.set_eviction(
                pool, session.name, priority=spec.priority, eviction_policy=spec.eviction_policy
            )
            written.append(session.name)
    return written
