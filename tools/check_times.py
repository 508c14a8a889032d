"""How long each interpreted check of a template test module takes (its `checks()`, as the module's
fixture runs them in one interpreter process), slowest first: where to look when the suite is slow.

    TRITON_INTERPRET=1 PYTHONPATH=. python tools/check_times.py tests.test_conv_template [tail_checks]
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    from kernelbrain.child.interpreted import fast_device_calls

    fast_device_calls()  # as kb's child and tests.runs' interpreter processes run candidates
    module = importlib.import_module(sys.argv[1])
    name = sys.argv[2] if len(sys.argv) > 2 else "checks"
    if not hasattr(module, name):
        raise SystemExit(f"{sys.argv[1]} has no {name}(): its interpreted checks run some other way")
    checks = getattr(module, name)()
    times = []
    for name, check in checks.items():
        began = time.perf_counter()
        try:
            check(Path(tempfile.mkdtemp()))
            outcome = "ok"
        except Exception as e:
            outcome = f"failed: {type(e).__name__}"
        times.append((time.perf_counter() - began, name, outcome))
    for took, name, outcome in sorted(times, reverse=True):
        print(f"{took:7.2f} s  {name}  ({outcome})")
    print(f"{sum(t for t, _, _ in times):7.2f} s  in all, {len(times)} checks")


if __name__ == "__main__":
    main()
