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


def kept_file(folder: str | Path, shape: int, call: int) -> Path:
    """A bench's timed call's outputs (raw bytes, as outputs_file), kept for the judge to check."""
    return Path(folder) / f"bench-shape{shape}-call{call}-outputs.bin"


def header_of(data: Path) -> Path:
    return data.with_suffix(".json")
