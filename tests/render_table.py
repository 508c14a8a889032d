"""The table of renders that guards the templates' output: every family's round-0 and once-mutated
candidates over a table of problems (the seed problems, tests/problems and the template tests' problem
variants), each analysed for the CPU and for a GPU (traced on meta), as the expert generator proposes
them with and without torch ops allowed. Each source is hashed; tests/test_render_hashes.py renders the
table again and compares.

The analyses are committed beside the hashes (tests/fixtures/renders/), so the test measures the
templates alone, not the tracer. A change that alters renders on purpose rewrites the hashes in the same
commit and says why:  python -m tests.render_table --hashes   (--analyses too when the problems change).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib
import json
from collections.abc import Iterator
from pathlib import Path

from kernelbrain.core import torch_ops
from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.generators.base import GenerationError, Proposal
from kernelbrain.generators.expert import ExpertGenerator
from kernelbrain.templates import FAMILIES
from kernelbrain.templates.base import Family

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "renders"
ANALYSES = FIXTURES / "analyses.json.gz"
HASHES = FIXTURES / "hashes.json.gz"
DEVICES = ("cpu", "cuda")
# the template tests whose problem_variants() join the table
VARIANT_MODULES = (
    "test_attention_template",
    "test_conv_transpose_template",
    "test_gemm_template",
    "test_gemv_template",
    "test_l2norm_template",
    "test_layernorm_template",
    "test_rmsnorm_template",
)


def problem_sources() -> dict[str, str]:
    """name -> problem source, the whole table."""
    out = {}
    for folder in ("benchmarks/problems", "tests/problems"):
        for path in sorted((ROOT / folder).glob("*.py")):
            out[f"{folder.split('/')[0]}/{path.stem}"] = path.read_text()
    for module in VARIANT_MODULES:
        variants = importlib.import_module(f"tests.{module}").problem_variants()
        for name, text in sorted(variants.items()):
            out[f"{module}/{name}"] = text
    return out


def analyse_all() -> dict[str, dict]:
    """'name@device' -> the analysis kb's child makes of it (problems that fail analysis are left out)."""
    from kernelbrain.child.analysis import analyse

    out = {}
    for name, source in problem_sources().items():
        for device in DEVICES:
            try:
                out[f"{name}@{device}"] = {"source": source, "analysis": analyse(source, device)}
            except Exception as e:  # a problem the tracer refuses is no render to guard
                print(f"skipped {name}@{device}: {type(e).__name__}: {e}")
    return out


def load_analyses() -> dict[str, dict]:
    return json.loads(gzip.decompress(ANALYSES.read_bytes()))


def load_hashes() -> dict[str, str]:
    return json.loads(gzip.decompress(HASHES.read_bytes()))


def digest(p: Proposal) -> str:
    return hashlib.sha256(p.source.encode()).hexdigest()[:16]


# every profile label any family answers: a family (or a partial candidate's tail) takes its own
LABELS = sorted({label for f in FAMILIES for label in f.MUTATIONS})


def proposals(table: dict[str, dict]) -> Iterator[tuple[str, Proposal | str]]:
    """(key, the proposal or what stopped it) for every render of the table: round 0, then each round-0
    candidate mutated by every move of every label its family knows."""
    for key, entry in sorted(table.items()):
        source = entry["source"]
        analysis = ProblemAnalysed(**entry["analysis"], families=[])
        generators = {"triton": _Matched(), "torch": _Matched(allow_torch=tuple(torch_ops.CLASSES))}
        for gname, gen in generators.items():
            where = f"{key}/{gname}"
            try:
                first = gen.first_round(analysis, problem_source=source)
            except GenerationError as e:
                yield where, f"none: {e}"
                continue
            for i, p in enumerate(first):
                yield f"{where}/r0.{i} {p.family}:{p.strategy}", p
                for label in LABELS:
                    try:
                        moved = gen.mutate(analysis, p.knobs, p.family, [label], problem_source=source)
                    except GenerationError as e:
                        yield f"{where}/r0.{i}/{label}", f"none: {e}"
                        continue
                    for j, m in enumerate(moved):
                        yield f"{where}/r0.{i}/{label}.{j} {m.strategy}", m


class _Matched(ExpertGenerator):
    """A generator for one problem that matches its family once, not once per label of each candidate's
    mutation (what `mutate` does on each call, most of this table's time): the same answer each time."""

    def __init__(self, allow_torch: tuple[str, ...] = ()) -> None:
        super().__init__(allow_torch)
        self.matched: dict[tuple[str | None, str | None], tuple[Family, dict]] = {}

    def match_family(
        self, analysis: ProblemAnalysed, name: str | None = None, problem_source: str | None = None
    ) -> tuple[Family, dict]:
        if (name, problem_source) not in self.matched:
            self.matched[name, problem_source] = super().match_family(analysis, name, problem_source)
        return self.matched[name, problem_source]


def renders(table: dict[str, dict]) -> Iterator[tuple[str, str]]:
    """(key, hash or what stopped it) for every render of the table (`proposals`)."""
    for key, p in proposals(table):
        yield key, p if isinstance(p, str) else digest(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--analyses", action="store_true", help="trace the table's problems again")
    ap.add_argument("--hashes", action="store_true", help="render the table and write the hashes")
    args = ap.parse_args()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    if args.analyses:
        data = json.dumps(analyse_all(), sort_keys=True).encode()
        ANALYSES.write_bytes(gzip.compress(data, mtime=0))
    if args.hashes:
        text = json.dumps(dict(renders(load_analyses())), indent=0, sort_keys=True) + "\n"
        HASHES.write_bytes(gzip.compress(text.encode(), mtime=0))


if __name__ == "__main__":
    main()
