"""Mutating admission webhook: turns gpu-fraction / gpu-memory annotations into env, affinity, labels."""
