"""Kubernetes access: pure request builders kept apart from client.py, the one module that does I/O."""
