"""gpupack's shared library: request model, cluster model, placement, Kubernetes access, CLI."""
