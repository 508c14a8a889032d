"""Every family's round-0 and once-mutated renders over the table of problems (tests/render_table.py)
hash as committed: a refactor of the templates changes no kernel a run would propose. A change that
alters renders on purpose rewrites tests/fixtures/renders/hashes.json.gz in the same commit
(`python -m tests.render_table --hashes`) and says why in its message."""

from __future__ import annotations

from kernelbrain.templates import FAMILIES, partial
from tests.render_table import digest, load_analyses, load_hashes, proposals
from tests.test_subset import outside_subset


def test_every_render_of_the_table_hashes_as_committed_within_the_candidate_subset() -> None:
    """... and every one is within kb's candidate subset (kernelbrain/core/subset.py), checked here where
    the table is rendered: a template's source, as an LLM sees it for a mutation, fits the subset."""
    want = load_hashes()
    made = list(proposals(load_analyses()))
    got = {key: p if isinstance(p, str) else digest(p) for key, p in made}
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
    refused = outside_subset((key, p) for key, p in made if not isinstance(p, str))
    assert not refused, f"{len(refused)} renders outside the candidate subset:\n" + "\n".join(refused[:20])
