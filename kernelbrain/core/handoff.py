"""The files a gate hands between the judge's child and the candidate's, named in one place: per gate
shape the init inputs and the reference's weights, per shape and seed the inputs (written by the judge
into a folder the candidate's child sees read-only) and the candidate's outputs (written in its own
folder, then handed to the judge); and the outputs of a bench's checked timed calls, for the judge."""

from __future__ import annotations

from pathlib import Path


def init_file(folder: str | Path, shape: int) -> Path:
    return Path(folder) / f"shape{shape}-init.pt"


def inputs_file(folder: str | Path, shape: int, seed: int) -> Path:
    return Path(folder) / f"shape{shape}-seed{seed}-inputs.pt"


def outputs_file(folder: str | Path, shape: int, seed: int) -> Path:
    """Raw bytes (kernelbrain.child.tensorfile), described by the file `header_of` names."""
    return Path(folder) / f"shape{shape}-seed{seed}-outputs.bin"


# the first of the three drawn sets a bench's and a duel's inputs rotate through (kernelbrain/child/
# timing.py): the judge draws them again to rebuild a kept timed call's inputs
BENCH_SEED, DUEL_SEED = 100, 200


def kept_file(folder: str | Path, shape: int, call: int, side: str = "") -> Path:
    """A bench's (or a duel side's) timed call's outputs (raw bytes, as outputs_file), for the judge."""
    return Path(folder) / f"bench-shape{shape}{'-' + side if side else ''}-call{call}-outputs.bin"


def header_of(data: Path) -> Path:
    return data.with_suffix(".json")
