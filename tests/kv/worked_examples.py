"""The issue's worked examples (notes/vllm-omni-ar-diffusion.md §2), shared by the planner's own tests and the
comparison with vllm-omni's runner."""

from __future__ import annotations

from ardiff.kv.capacity import CrossAttentionCache, KVBranch, KVCacheSpec

TINY = KVCacheSpec(
    num_layers=1,
    num_kv_heads=1,
    head_size=1,
    tokens_per_frame=1,
    frames_per_block=3,
    window_frames=3,
    sink_frames=3,
    kv_branches=(KVBranch("main", 0),),
    session_capacity=2,
    cross_attention=(CrossAttentionCache("text", 2),),
)
DREAMZERO_LIKE = KVCacheSpec(
    num_layers=2,
    num_kv_heads=4,
    head_size=64,
    tokens_per_frame=16,
    frames_per_block=4,
    window_frames=6,
    sink_frames=0,
    kv_branches=(KVBranch("positive", 0), KVBranch("negative", 1)),
    session_capacity=64,
    cross_attention=(CrossAttentionCache("text", 8),),
)
