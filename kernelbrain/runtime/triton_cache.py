"""The Triton caches of sandboxed children, on the host. Under bubblewrap each child has a cache of its
own (a shared one would let one candidate replace another's compiled kernels), emptied before each
request; what it needs is copied in from two host folders no child sees:

- `COMPILED/<sha256 of the source>`: what a candidate's passing gate compiled, for the children that
  time and profile the same source (they load it rather than compile again);
- `LAUNCHERS`: Triton's launchers (a C module per kernel signature), built by judges, which run no
  candidate code (kernelbrain/child/launchers.py), for every child.

And one folder every child reads in place, read-only, behind its own cache (`SHARED`, through Triton's
cache manager `MANAGER`): what passing gates compiled in children that never ran code but kb's own (a
process that loaded only candidates of kb's own templates). Candidates of one problem's templates share
kernels (same source, same constants), and a run, or the next run, finds them compiled. No candidate
from outside (an LLM's) adds to it: it could plant a binary under a key another candidate's source hashes
to.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, ValidationError

COMPILED = Path.home() / ".cache" / "kernelbrain" / "compiled"
LAUNCHERS = Path.home() / ".cache" / "kernelbrain" / "launchers"
SHARED = Path.home() / ".cache" / "kernelbrain" / "shared"
LAUNCHER_FILE = "__triton_launcher"
# what a bubblewrap child's Triton looks entries up with: its own cache, then SHARED (read-only there)
MANAGER = "kernelbrain.child.shared_cache:WithShared"


def compiled_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


class TritonGroup(BaseModel):
    """A Triton cache entry's index (`__grp__<name>.json`): the absolute paths of its files."""

    child_paths: dict[str, str]


def _links(folder: str, names: list[str]) -> set[str]:
    """What a copy of a child's cache leaves out: links (one could name any file of the host's)."""
    return {n for n in names if os.path.islink(os.path.join(folder, n))}


def _keep(folder: Path, kept: Path, *, entry: bool = False) -> None:
    """A copy of a child's cache folder on the host, made whole or not at all (links left out). An
    `entry` (one kernel's folder) has its index pointed at where it is kept, for children to read there."""
    try:  # the folder itself as it is now, never where a link put in its place by a child points
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    kept.parent.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=".part-", dir=kept.parent))
    try:
        shutil.copytree(f"/proc/self/fd/{fd}", part, dirs_exist_ok=True, ignore=_links)
        if entry:
            for index in part.glob("__grp__*.json"):
                _point(index, kept)
        os.replace(part, kept)
    except OSError:  # another worker kept it first, or the disk is full: it is built again
        shutil.rmtree(part, ignore_errors=True)
    finally:
        os.close(fd)


def _point(index: Path, folder: Path) -> None:
    """Point an entry's index at its files in `folder`: Triton writes absolute paths, of the child that
    compiled it, and takes an entry whose files it cannot find for a miss. An index that is not one (the
    candidate's child wrote the entry) is removed: that entry compiles again."""
    try:
        group = TritonGroup.model_validate_json(index.read_bytes())
    except (OSError, ValidationError):
        index.unlink(missing_ok=True)
        return
    moved = {name: str(folder / Path(path).name) for name, path in group.child_paths.items()}
    index.write_text(TritonGroup(child_paths=moved).model_dump_json())


def _regroup(cache: Path) -> None:
    """Point every entry's index at its files where they are now."""
    for index in cache.glob("*/__grp__*.json"):
        _point(index, index.parent)


def fill(cache: Path, sources: list[str]) -> None:
    """Empty a child's cache of whatever an earlier candidate left there, and fill it with the judges'
    launchers and what the gate compiled for these sources."""
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir()
    if LAUNCHERS.is_dir():
        shutil.copytree(LAUNCHERS, cache, dirs_exist_ok=True, ignore=_links)
    for source in sources:
        kept = COMPILED / compiled_key(source)
        if kept.is_dir():
            shutil.copytree(kept, cache, dirs_exist_ok=True, ignore=_links)
    _regroup(cache)
    owner = cache.parent.stat()
    if owner.st_uid != os.geteuid():  # a child of its own uid (runtime/limits.py) compiles into it too
        for root, dirs, files in os.walk(cache):
            for name in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
                os.chown(name, owner.st_uid, owner.st_gid, follow_symlinks=False)


def keep_compiled(cache: Path, source: str) -> None:
    """What a child's cache holds after a passing trial (emptied before it): the candidate's compiled
    kernels, kept once for the children that time it."""
    if not cache.is_dir() or not any(cache.iterdir()):
        return
    kept = COMPILED / compiled_key(source)
    if not kept.exists():
        _keep(cache, kept)


def share(cache: Path, brought: set[str]) -> None:
    """The entries of a child's cache that a request compiled (not among those `brought` to it) in a
    process that ran only kb's own code, kept in SHARED, where it lacks them, for every child."""
    if not cache.is_dir():
        return
    for entry in cache.iterdir():
        known = entry.name in brought or (SHARED / entry.name).exists()
        if entry.is_dir() and not entry.is_symlink() and not known:
            _keep(entry, SHARED / entry.name, entry=True)


def keep_launchers(judge_cache: Path) -> None:
    """The launchers a judge's cache holds that the host does not yet keep (nothing else of the judge's)."""
    if not judge_cache.is_dir():
        return
    for entry in judge_cache.iterdir():
        if (
            entry.is_dir()
            and any(f.name.startswith(LAUNCHER_FILE) for f in entry.iterdir())
            and not (LAUNCHERS / entry.name).exists()
        ):
            _keep(entry, LAUNCHERS / entry.name)
