"""Enforcement: which pod a host process belongs to, each container's env and GPUs checked against its
allocation, per-cgroup GPU memory limits, and the watchdog that ends what breaks them."""
