"""ardiff: interactive AR-diffusion world models served as Kubernetes sessions."""

__version__ = "0.1.0"
