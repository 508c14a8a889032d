"""The processes: the worker loop, one module per role, the runner, the sandbox client."""
