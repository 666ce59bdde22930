"""The GPU worker: vllm-omni's paged-KV runner behind an HTTP tick endpoint."""
