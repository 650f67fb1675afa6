"""Trace-driven simulation of gpupack placement (the FGD/openb methodology)."""
