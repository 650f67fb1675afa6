"""The simulated GPU backend (a GPU set from a file, its per-cgroup limits, its allocator): imported only
where the agent's settings choose it (`--sim`), never by the real node's code paths."""
