"""Make the in-tree packages importable when the distribution is not pip-installed."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="module")
def box():
    """One warm CPU sandbox child per test module (torch and Triton import once)."""
    from kernelbrain.sandbox import Sandbox

    sb = Sandbox("cpu")
    try:
        yield sb
    finally:
        sb.close()
