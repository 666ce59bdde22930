"""Same-pod forks by shared KV blocks (issue 26 item 3): a child gets its parent's self-attention blocks by
block table and reference count, not by copy.

At a tick boundary every block of a session's self-attention table is full and committed, and nothing ever
writes to a committed block again: the next chunk's K/V goes into blocks allocated after the table's end,
and blocks that slide out of the window are dropped from the table (freed, i.e. their reference count goes
down). So a child forked at the parent's current boundary may hold the very same blocks: vLLM's block pool
counts references (`BlockPool.touch` adds one, `free_blocks` takes one away and frees a block only at zero),
and the KV manager's per-request block table (`req_to_blocks`) is a plain list. Sharing is one `touch` and one
table copy per KV branch, no bytes moved, no vLLM or vllm-omni source patched; each session then frees only
its own references, so either may close first. Where they diverge, each allocates its own blocks for its new
chunks: after `window_chunks` ticks nothing (but the sink) is shared any more.

The blocks are shared only when the parent's branch is exactly where the export says (the same position,
chunks, compaction and block count): then its blocks hold the export's pages. Cross-attention caches are
per-session pools in vllm-omni, so they are copied from the export as before.

Capacity does not count shared blocks: the KV pool is sized for `capacity` full windows, and a child that
keeps ticking needs its own full window within `window_chunks` ticks; what sharing saves is the memory and
the copy at the fork, and the blocks the two hold together until they diverge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _window_manager(kv: Any) -> Any:
    """The KV manager's single (chunk-window) manager: the one that keeps the block tables."""
    (manager,) = kv.manager.coordinator.single_type_managers
    return manager


def branch_matches(kv: Any, adapter: Any, branch: Mapping[str, Any]) -> bool:
    """Whether the resident `adapter` is at the boundary an export's `kv_branches` entry describes, its
    table compact (no null block, one full block per computed block of tokens): its blocks then hold that
    export's pages."""
    table = kv.block_table(adapter)
    return (
        kv.null_block_id not in table
        and len(table) == branch["num_blocks"]
        and adapter.num_computed_tokens == len(table) * kv.block_size == branch["num_computed_tokens"]
        and int(adapter.completed_chunks) == branch["completed_chunks"]
        and int(adapter.compacted_tokens) == branch["compacted_tokens"]
        and int(adapter._prefill) == branch["prefill"]
    )


def share_blocks(kv: Any, parent: Any, child: Any) -> int:
    """Give the empty adapter `child` the blocks of `parent` (one more reference each); the blocks shared."""
    manager = _window_manager(kv)
    if manager.req_to_blocks.get(child.request_id):
        raise ValueError(f"request {child.request_id!r} already holds KV blocks")
    blocks = list(manager.req_to_blocks.get(parent.request_id, ()))
    kv.manager.block_pool.touch(blocks)
    manager.req_to_blocks[child.request_id] = blocks
    return len(blocks)


def shared_blocks(kv: Any) -> int:
    """Blocks of the pool more than one session holds now (`KVBlocks.shared`). Reads only the block tables
    (the sessions' windows), not the pool (the tiny LingBot's CPU pool has 466,796 blocks: 0.1 s a pass); each
    `list` copy is one step under the GIL, so the forward thread may change the tables meanwhile."""
    held = {
        block.block_id: block
        for blocks in list(_window_manager(kv).req_to_blocks.values())
        for block in list(blocks)
        if not block.is_null
    }
    return sum(1 for block in held.values() if block.ref_cnt > 1)
