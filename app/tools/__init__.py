"""The operator tools: `gpupack simulate`, `top`, `explain` and `repack`."""
