"""The extender's HTTP routes: scheduling verbs, ops endpoints, read-only state."""
