"""Kubernetes access: pure request builders (requests.py) apart from the one module that does I/O (client.py)."""
