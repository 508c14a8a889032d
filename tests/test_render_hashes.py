"""Every family's round-0 and once-mutated renders over the table of problems (tests/render_table.py)
hash as committed: a refactor of the templates changes no kernel a run would propose. A change that
alters renders on purpose rewrites tests/fixtures/renders/hashes.json.gz in the same commit
(`python -m tests.render_table --hashes`) and says why in its message."""

from __future__ import annotations

from kernelbrain.templates import FAMILIES, partial
from tests.render_table import load_analyses, load_hashes, renders


def test_every_render_of_the_table_hashes_as_committed() -> None:
    want = load_hashes()
    got = dict(renders(load_analyses()))
    missing = sorted(set(want) - set(got))
    new = sorted(set(got) - set(want))
    changed = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    lines = [f"changed {k}: {want[k]} -> {got[k]}" for k in changed]
    lines += [f"no longer rendered {k}" for k in missing] + [f"new {k}" for k in new]
    assert not lines, f"{len(lines)} renders differ from the baseline:\n" + "\n".join(lines[:60])
    # the table covers every family and the partial candidates, each at round 0 and mutated
    rendered = {k.split(" ")[1].split(":")[0] for k in got if "/r0." in k and "/" not in k.split("/r0.")[1]}
    assert rendered == {f.FAMILY for f in FAMILIES} | {partial.FAMILY}
    assert sum("/r0." in k and "/" in k.split("/r0.")[1] for k in got) > 10000
