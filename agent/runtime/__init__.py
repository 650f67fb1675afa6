"""The node-side decision: the runtime handler's create, createRuntime hook, stop and delete, answered on the
agent's socket from one grant per container; and putting the handler on the node."""
