"""Sizing every family shares: powers of two, a block clamped to the traced dims, the warp counts a
program may have, what fits a thread's registers, and the tile and warp moves of a mutation."""

from __future__ import annotations

from typing import Any

Knobs = dict[str, Any]
WARPS = (1, 2, 4, 8, 16)  # warps a program may have
# elements a program may hold in registers; past this Triton spends minutes compiling a kernel that spills
MAX_BLOCK = 32768
WARP_MOVES = ("more_warps", "fewer_warps")


def next_pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def pow2(*blocks: int, least: int = 1) -> bool:
    """Every block a power of two of at least `least` (a tl.dot's tiles: 16)."""
    return all(b >= least and not b & (b - 1) for b in blocks)


def clamp(block: int, dim: int | None, least: int = 1) -> int:
    """A knob's block at a traced dim: never wider than the dim rounded up to a power of two (nor below
    `least`); the knob's own where the dim is unknown."""
    return min(block, max(least, next_pow2(dim))) if dim else block


def fits(elements: int, warps: int, per_thread: int) -> bool:
    """Whether a program's `elements` spread over its warps' threads stay within `per_thread` each."""
    return elements <= per_thread * 32 * warps


def warps(knobs: Knobs, move: str) -> Knobs | None:
    """A warp move: "more_warps" doubles num_warps (up to 16), "fewer_warps" halves it (down to 1); None
    at the limit or for another move."""
    n = knobs["num_warps"]
    if move == "more_warps" and n < WARPS[-1]:
        return {**knobs, "num_warps": n * 2}
    if move == "fewer_warps" and n > WARPS[0]:
        return {**knobs, "num_warps": n // 2}
    return None


def step(knobs: Knobs, move: str, key: str, blocks: tuple[int, ...]) -> Knobs | None:
    """The tile and warp moves the families with one tile axis share: `key` one step along `blocks`
    ("larger_tiles", "smaller_tiles"), or a warp move; None where the move is another or at its limit."""
    k = dict(knobs)
    at = blocks.index(k[key]) if k[key] in blocks else None
    if move == "larger_tiles" and at is not None and at + 1 < len(blocks):
        return {**k, key: blocks[at + 1]}
    if move == "smaller_tiles" and at:
        return {**k, key: blocks[at - 1]}
    return warps(k, move)


def doubled(knobs: Knobs, key: str, below: int) -> Knobs | None:
    """The knobs with `key` doubled, where it is below `below` (None at the limit)."""
    return {**knobs, key: knobs[key] * 2} if knobs[key] < below else None


def halved(knobs: Knobs, key: str, above: int) -> Knobs | None:
    """The knobs with `key` halved, where it is above `above` (None at the limit)."""
    return {**knobs, key: knobs[key] // 2} if knobs[key] > above else None


def stages(knobs: Knobs, move: str, most: int = 5) -> Knobs | None:
    """A pipeline move: "more_stages" adds one (up to `most`), "fewer_stages" takes one (down to 1)."""
    n = knobs["num_stages"]
    if move == "more_stages" and n < most:
        return {**knobs, "num_stages": n + 1}
    if move == "fewer_stages" and n > 1:
        return {**knobs, "num_stages": n - 1}
    return None
