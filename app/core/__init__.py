"""The core model and placement (pure): what a pod asks for, the cluster as placement sees it, the placement
policies and the readings built on them. No Kubernetes, HTTP or metrics I/O."""
