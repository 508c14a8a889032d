"""What of a worker's environment reaches the processes it starts: a sandboxed child sees the toolchain
only, and no worker but the generator holds a key."""

from __future__ import annotations

# What a child may see of the worker's environment: the toolchain, never keys or tokens.
ENV_ALLOWED = (
    "PATH",
    "LANG",
    "LC_ALL",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "TRITON_CACHE_DIR",
    "TRITON_PTXAS_PATH",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OMP_NUM_THREADS",
    "KB_EXEC_LOG",
    "KB_INJECT_OOM",
)
# GPU toolchain settings travel whole (the H200 hosts require NCCL_NVLS_ENABLE=0 and friends to stay set)
ENV_PREFIXES = ("CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM", "TRITON_")
ENV_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
# secrets every worker needs to reach a PostgreSQL store (libpq reads it); never passed to a child
STORE_SECRETS = ("PGPASSWORD",)


def is_secret(name: str) -> bool:
    return any(word in name.upper() for word in ENV_SECRET_WORDS)


def child_env_allowed(name: str) -> bool:
    return not is_secret(name) and (name in ENV_ALLOWED or name.startswith(ENV_PREFIXES))


def without_secrets(env: dict[str, str]) -> dict[str, str]:
    """env less every key, token, secret, password or credential but the store's (STORE_SECRETS): what a
    worker that starts sandboxes holds (only the generator, which talks to the LLM, keeps the key)."""
    return {k: v for k, v in env.items() if not is_secret(k) or k in STORE_SECRETS}
