"""Several reductions in sequence, each reading the inputs and the reductions before it, composed from
the traced graph: a cosine-similarity loss (two row norms, a row sum of the normalised product, a
mean), a triplet margin loss (two row distances, a mean of the hinge), a row statistic used by a later
reduction:

    s_k = epilogue_k(reduce_k(prologue_k(x0, ..., s_0, ..., s_k-1)))   each in fp32, the last one the output

Each stage is one launch of the reduce family's kernel (families/reduce/parts.py) with its own chains,
its statistics of the stages before it as broadcast inputs; the candidate's module holds a renamed copy
of the kernel and launcher for each.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import INPUT, Graph, Node
from kernelbrain.templates import render as rendering
from kernelbrain.templates.base import Refusal, matches_by, one_output, unsized
from kernelbrain.templates.families import pointwise, reduce

FAMILY = "staged"
ROUND0 = reduce.ROUND0
MUTATIONS = reduce.MUTATIONS
mutate = reduce.mutate
_PER_STAGE = ("_prologue", "_epilogue", "_reduce_kernel", "_reduce_launch")


class NotStaged(Refusal):
    """What the graph holds that this family cannot compose."""


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    return all(reduce.feasible(stage, knobs) for stage in spec["stages"])


def compose(graph: Graph) -> dict:
    """The reduce specs of each stage, in order; the last one's value is the output."""
    one_output(graph, NotStaged)
    unsized(graph, NotStaged)
    found = [i for i, n in enumerate(graph.nodes) if n.op in reduce.REDUCTIONS]
    if len(found) < 2:
        raise NotStaged(f"{len(found)} reductions")
    n_forward = 1 + max(int(n.args["index"]) for n in graph.nodes if n.op == INPUT)
    nodes = list(graph.nodes)
    stages = []
    for k, at in enumerate(found):
        if k < len(found) - 1:
            if any(r[0] == at and r[1] != 0 for r in _uses(graph)):
                raise NotStaged(f"{graph.nodes[at].op}'s second result")
            sub = Graph(nodes=nodes[: at + 1], outputs=[[at, 0]])
        else:
            sub = Graph(nodes=nodes, outputs=graph.outputs)
        stages.append(reduce.compose(sub))
        # later stages read this one's value as one more input
        nodes[at] = Node(op=INPUT, args={"index": n_forward + k}, outs=[graph.nodes[at].outs[0]])
    for stage in stages[:-1]:
        stage["dtype"] = "float32"
    return {"stages": stages, "n_forward": n_forward, "ops": graph.ops()}


def _uses(graph: Graph) -> set[tuple[int, int]]:
    return {r for n in graph.nodes for v in n.args.values() for r in graph.refs(v)}


matches = matches_by(compose)


def stage_parts(spec: dict) -> list[str]:
    """Each stage's chains and reduce kernel and launcher, its names suffixed with its index."""
    out = []
    for k, stage in enumerate(spec["stages"]):
        chains = rendering.chain("_prologue", stage["prologue"], stage["prologue_result"])
        chains += "\n\n" + rendering.chain("_epilogue", stage["epilogue"], stage["epilogue_result"])
        text = chains + "\n\n" + rendering.parts_of(reduce.PARTS, "_reduce_kernel", "_reduce_launch")
        out.append(rendering.renamed(text, f"_{k}", _PER_STAGE))
    return out


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    forward = signature["forward"]
    stages = spec["stages"]
    doc = rendering.graph_doc(
        f"{len(stages)} reductions in sequence", FAMILY, spec, knobs, "Each stage one launch in fp32"
    )

    def name(i: int) -> str:  # a forward input, or an earlier stage's value
        return forward[i] if i < spec["n_forward"] else f"kb_s{i - spec['n_forward']}"

    calls = []
    for k, stage in enumerate(stages):
        xs = ", ".join(name(i) for i in stage["inputs"])
        divisor = "0"
        if stage.get("divide_by"):
            index, start, end = stage["divide_by"]
            divisor = f"_prod({forward[index]}.shape[{start}:{end}])"
        dtype = rendering.dtype_of(stage["dtype"], f"{forward[0]}.dtype")
        calls.append(f"        xs = [{xs}]\n")
        how = [repr(stage["dims"]), repr(stage["keepdim"]), dtype]
        how += [str(stage[x]) for x in ("op", "pre", "post")]
        knobs_at = "BLOCK_K, BLOCK_R, SPLIT, NUM_WARPS"
        calls.append(f"        kb_s{k} = _reduce_launch_{k}(xs, {', '.join(how)}, {knobs_at}, {divisor})\n")
    lines = "".join(calls) + f"        return kb_s{len(stages) - 1}\n"
    return rendering.module(
        doc,
        rendering.constants(BLOCK_K=knobs["block_k"], BLOCK_R=knobs["block_r"], SPLIT=knobs["split"]),
        rendering.constants(NUM_WARPS=knobs["num_warps"]),
        pointwise.helper_parts(*stages),
        reduce.shared_parts(),
        *stage_parts(spec),
        rendering.plain_model(signature, lines),
    )
