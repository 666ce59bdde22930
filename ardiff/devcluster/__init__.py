"""A development harness: emulated Kubernetes API, local pod runner, real Redis/operator/workers."""
