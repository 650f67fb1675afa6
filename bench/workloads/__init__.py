"""Workload generators the benchmarks replay (bursts, churn with departures, pinned models, MIG variants,
saturation): not part of the product; `gpupack simulate` replays a trace as it is."""
