"""kube-scheduler extender: filter, prioritize and bind gpupack pods onto individual GPUs."""
