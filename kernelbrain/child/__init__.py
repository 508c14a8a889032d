"""Runs inside the sandboxed child, beside candidate code, and nowhere else."""
