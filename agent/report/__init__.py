"""Reporting: the GPUs as read through NVML, published as the GPUNode, node labels and extended resources,
with what each GPU enforces between the pods sharing it."""
