"""The kopf control plane for ARDiffusionWorkerPool and ARDiffusionSession."""
