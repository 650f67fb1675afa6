"""The GPU backend: the narrow NVML interface, the real pynvml backend, and one reading of every GPU through
it."""
