"""gpupack's library and the `gpupack` command (cli). Its rooms: core (model and placement, pure), kube
(Kubernetes access), service (what the services share), tools (the operator tools)."""
