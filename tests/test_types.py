"""mypy on kb, as pyproject.toml's [tool.mypy] sets it (strict): store/ and kernelbrain/core/ pass it,
and no other module of kernelbrain/ holds more errors than tests/mypy_baseline.json records for it. The
baseline may only shrink: a module with fewer errors than recorded fails too, until the count is lowered.

store/ installs as kernelbrain.store (pyproject's package-dir), which mypy cannot map from the tree: the
check runs on a temporary kernelbrain/ of links to the tree's own folders and modules, with store/ linked
in as its store. mypy's cache lives in pytest's temporary folder (one cold run, about 20 s of CPU).

    python tests/test_types.py                   # mypy's errors, as it prints them
    python tests/test_types.py --write-baseline  # record the counts (after a fix, or a module's move)
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "mypy_baseline.json"
STRICT = ("kernelbrain.core", "kernelbrain.store")  # the layers that must pass with no error at all
ERROR = re.compile(r"^(kernelbrain/[^:]+)\.py:\d+: error: ")


def linked_tree(where: Path) -> Path:
    """A kernelbrain/ package under `where` as it installs: the tree's kernelbrain/ entries, and store/
    as kernelbrain/store; returns `where`."""
    package = where / "kernelbrain"
    package.mkdir()
    for entry in (ROOT / "kernelbrain").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    (package / "store").symlink_to(ROOT / "store")
    return where


def mypy(where: Path) -> subprocess.CompletedProcess[str]:
    """mypy with pyproject's settings on the linked kernelbrain/ package in `where`."""
    config, cache = ROOT / "pyproject.toml", where / ".mypy_cache"
    argv = ["--config-file", str(config), "--cache-dir", str(cache), "--no-pretty", "-p", "kernelbrain"]
    return subprocess.run(
        [sys.executable, "-m", "mypy", *argv], cwd=linked_tree(where), capture_output=True, text=True
    )


def module_of(line: str) -> str | None:
    """The module an error line of mypy's is in (None: a note, a summary)."""
    m = ERROR.match(line)
    return m.group(1).replace("/", ".").removesuffix(".__init__") if m else None


def errors_per_module(output: str) -> dict[str, int]:
    return dict(Counter(m for m in map(module_of, output.splitlines()) if m is not None))


def in_strict_layer(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in STRICT)


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, int]]:
    """mypy's output lines and its errors per module, from one run."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    run = mypy(tmp_path_factory.mktemp("mypy"))
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 2: mypy itself failed (the config, a crash)
    return run.stdout.splitlines(), errors_per_module(run.stdout)


def test_store_and_core_pass_mypy_strict(checked: tuple[list[str], dict[str, int]]) -> None:
    lines, _ = checked
    strict = [line for line in lines if (m := module_of(line)) and in_strict_layer(m)]
    assert not strict, "mypy --strict errors in store/ or kernelbrain/core/:\n" + "\n".join(strict)


def test_no_module_has_more_mypy_errors_than_the_baseline(checked: tuple[list[str], dict[str, int]]) -> None:
    lines, counts = checked
    baseline = json.loads(BASELINE.read_text())
    grown = {m: (n, baseline.get(m, 0)) for m, n in counts.items() if n > baseline.get(m, 0)}
    assert not grown, (
        "more mypy errors than tests/mypy_baseline.json records (module: now > recorded); fix them:\n"
        + "\n".join(f"  {m}: {now} > {was}" for m, (now, was) in sorted(grown.items()))
        + "\n"
        + "\n".join(line for line in lines if module_of(line) in grown)
    )


def test_the_baseline_records_no_more_than_is_left(checked: tuple[list[str], dict[str, int]]) -> None:
    _, counts = checked
    baseline = json.loads(BASELINE.read_text())
    assert not any(in_strict_layer(m) for m in baseline), "store/ and core/ have no baseline: they pass"
    shrunk = {m: (counts.get(m, 0), n) for m, n in baseline.items() if counts.get(m, 0) < n}
    assert not shrunk, (
        "fewer mypy errors than tests/mypy_baseline.json records (module: now < recorded); lower it with "
        "`python tests/test_types.py --write-baseline`:\n"
        + "\n".join(f"  {m}: {now} < {was}" for m, (now, was) in sorted(shrunk.items()))
    )


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kb-mypy-") as tmp:
        run = mypy(Path(tmp))
    if "--write-baseline" not in sys.argv[1:]:
        sys.stdout.write(run.stdout + run.stderr)
        sys.exit(run.returncode)
    counts = errors_per_module(run.stdout)
    strict = sorted(m for m in counts if in_strict_layer(m))
    if strict:
        sys.exit(f"store/ and core/ must pass, not be baselined: fix {', '.join(strict)} first")
    BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
    print(f"{BASELINE.relative_to(ROOT)}: {sum(counts.values())} errors in {len(counts)} modules")


if __name__ == "__main__":
    main()
