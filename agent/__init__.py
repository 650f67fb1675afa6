"""The node agent, in rooms: report (the GPUNode), runtime (the handler's questions), mpsdaemon, enforce,
nvml (the GPU backend), simgpu (the simulated GPU, only where chosen); main and command wire them, loop runs
the cycle."""
