"""Triton's cache in a bubblewrap child: its own folder first, then the shared one the host keeps
(kernelbrain/runtime/triton_cache.py), read in place and read-only. Triton builds this class for every
lookup through `TRITON_CACHE_MANAGER`; what the child compiles still goes to its own folder."""

from __future__ import annotations

import json
import os

from triton.runtime.cache import FileCacheManager

from kernelbrain.core.protocol import TRITON_SHARED_ENV


class WithShared(FileCacheManager):
    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        root = os.environ.get(TRITON_SHARED_ENV)
        self.shared = os.path.join(root, key) if root and not (override or dump) else None

    def get_file(self, filename: str) -> str | None:
        found = super().get_file(filename)
        if found is not None or self.shared is None:
            return found
        path = os.path.join(self.shared, filename)
        return path if os.path.isfile(path) else None

    def get_group(self, filename: str) -> dict[str, str] | None:
        found = super().get_group(filename)
        if found is not None or self.shared is None:
            return found
        try:
            with open(os.path.join(self.shared, f"__grp__{filename}")) as f:
                paths = json.load(f)["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        files = paths.values() if isinstance(paths, dict) else [None]
        if not all(isinstance(p, str) and os.path.isfile(p) for p in files):
            return None
        return paths
