"""NVML access behind one narrow interface: the real pynvml backend and a file-driven simulator."""
