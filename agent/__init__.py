"""Node agent: NVML inventory and live usage, MPS, container-start checks."""
