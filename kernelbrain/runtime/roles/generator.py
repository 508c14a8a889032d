"""The generator role: the run's analysis (its first task), then round 0 and each mutation."""

from __future__ import annotations

import time
from dataclasses import replace

from kernelbrain import generators
from kernelbrain.core.events import CandidateProposed, GenerationDone, GenerationFailed, ProblemAnalysed
from kernelbrain.core.graph import RANDOM_OPS
from kernelbrain.core.problem import RANDOM_IN_EVAL, RANDOM_IN_TRAINING, TOO_BIG
from kernelbrain.core.protocol import AnalyseReply, AnalyseRequest
from kernelbrain.core.state import RunState
from kernelbrain.generators.prompt import describe_numbers
from kernelbrain.runtime.device_room import ADMIT_SHARE, admitted_memory
from kernelbrain.runtime.role import Role, Task
from kernelbrain.runtime.sandbox import SandboxFault
from kernelbrain.store import NewEvent


def stochastic(analysis: ProblemAnalysed) -> str | None:
    """Why a reference that draws random numbers cannot be matched (one line), or None: no kernel gives its
    outputs call for call. In training mode (dropout) eval mode is the way out; a draw made in eval mode
    too (F.dropout with training=True, noise added) has none."""
    if analysis.graph is None:
        return None
    drawn = sorted({n.op for n in analysis.graph.nodes if n.op in RANDOM_OPS})
    if not drawn:
        return None
    if analysis.mode == "training":
        return (
            f"{RANDOM_IN_TRAINING} ({', '.join(drawn)}: dropout?), as Model(*get_init_inputs()) is left, "
            "so no kernel can match its outputs; `kb run --eval` compares eval mode, where dropout is the "
            "identity"
        )
    return (
        f"{RANDOM_IN_EVAL} ({', '.join(drawn)}: a dropout called with training=True, or noise?), so no "
        "kernel can match its outputs; make the draw depend on self.training, or take it out of forward"
    )


def admission(analysis: ProblemAnalysed, device: str) -> str | None:
    """Why the problem cannot be measured on this device at all (one line), or None: a timed task's
    footprint past ADMIT_SHARE of the device's memory runs out of memory however idle the device is."""
    if not analysis.footprint or not analysis.device_memory:
        return None
    if analysis.footprint <= ADMIT_SHARE * analysis.device_memory:
        return None
    where = "GPU" if device == "cuda" else "CPU child (its memory cap)"
    return (
        f"{TOO_BIG}: a timed run of it needs about {analysis.footprint / 2**30:.3g} GiB (the bench's five "
        "copies of its inputs, its parameters, the reference's working memory and the candidate's outputs "
        f"at the shape its rungs time), the {where} holds {analysis.device_memory / 2**30:.3g} GiB; shrink "
        "get_inputs()'s sizes or use a larger device"
    )


class GeneratorRole(Role):
    name = "generator"
    uses_sandbox = True
    warms_cuda = False  # the analysis traces on the meta device, and it is the first task of a run
    abandons_on_stop = True  # an LLM request may hang for minutes: Ctrl-C must not wait for it
    runs_candidates = False  # its child traces the problem's reference only

    def tasks(self, state: RunState) -> list[Task]:
        # a task parked by a GenerationFailed (its lease completed) is a new task in a later session
        again = {t: f"/resume{len(state.resumes)}" for t in state.generation_failed}
        return [Task(f"{state.run_id}/gen/{t}{again.get(t, '')}", kind=t) for t in state.generation_tasks()]

    def wants_warm(self, state: RunState) -> bool:
        return state.analysis is None  # the analysis is this role's only use of a child

    @staticmethod
    def analysed(reply: AnalyseReply) -> ProblemAnalysed:
        """The child's analysis as the run's ProblemAnalysed event (the families that match come after)."""
        return ProblemAnalysed(
            ops=reply.ops,
            families=[],
            flops=reply.flops,
            bytes=reply.bytes,
            shapes=reply.shapes,
            signature=reply.signature.model_dump(),
            traced_on=reply.traced_on,
            rung_shapes=reply.rung_shapes,
            primary_ops=reply.primary_ops,
            fits=[f.model_dump() for f in reply.fits],
            graph=reply.graph,
            footprint=reply.footprint,
            gate_footprint=reply.gate_footprint,
            profile_footprint=reply.profile_footprint,
            device_memory=admitted_memory(reply.device_memory),
            mode=reply.mode,
            accuracy=reply.accuracy,
        )

    def analyse(self, task: Task, state: RunState) -> tuple[ProblemAnalysed, float]:
        """The problem's analysis and the GPU seconds it cost (none when traced on the meta device)."""
        cfg = state.config
        request = AnalyseRequest(problem_source=self.problem_source(state), device=cfg.device)
        asked = self.consult(cfg.device, request, timeout_s=cfg.analysis_timeout_s, task=task.key)
        if asked.reply is None:
            error = asked.line
            if isinstance(asked.fault, SandboxFault) and asked.fault.category == "timeout":
                error = (
                    f"importing it, building Model and tracing one forward did not finish within "
                    f"{cfg.analysis_timeout_s:g} s (KB_ANALYSIS_TIMEOUT_S): a loop, a download or a wait "
                    "at import or in __init__?"
                )
            analysis = ProblemAnalysed(ops=[], families=[], flops=0, bytes=0, shapes=[], error=error)
            busy = asked.busy_s
        else:
            analysis = self.analysed(asked.reply)
            busy = 0.0 if analysis.traced_on == "meta" else asked.busy_s  # shapes only: no GPU used
            if refused := stochastic(analysis) or admission(analysis, cfg.device):
                analysis = analysis.model_copy(update={"error": refused})
        from kernelbrain.templates import FAMILIES  # every family's module: in the generator alone

        # the template families that match, for the record
        families = [f.FAMILY for f in FAMILIES if f.matches(analysis.ops, analysis.graph) is not None]
        return analysis.model_copy(update={"families": families}), busy

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        cfg = state.config
        t0 = time.perf_counter()
        out: list[NewEvent] = []
        busy = 0.0
        analysis = state.analysis
        if analysis is None:
            analysis, busy = self.analyse(task, state)
            out.append(self.new(state, analysis, f"{state.run_id}/analysis"))
        parent = None
        note = ""
        proposals: list[generators.Proposal] = []
        tokens = 0
        if not analysis.error:
            try:
                gen = generators.get(cfg.generator, **cfg.generator_options())
                source = self.problem_source(state)
                if task.kind == "round0":
                    proposals = gen.first_round(analysis, problem_source=source)
                else:
                    parent = state.candidates[task.kind.split("/", 1)[1]]
                    proposals = gen.mutate(
                        analysis,
                        parent.proposal.knobs,
                        parent.proposal.family,
                        parent.profile.labels if parent.profile else [],
                        problem_source=source,
                        parent_source=self.candidate_source(state, parent.id),
                        numbers=describe_numbers(parent.results, parent.profile),
                    )
                tokens = sum(d.tokens for d in gen.discarded)  # replies that gave nothing still cost tokens
                if not proposals and gen.discarded:
                    note = "; ".join(f"{d.hint}: {d.reason}" for d in gen.discarded[:3])
            except generators.Unavailable as e:
                # a passing fault: no GenerationDone, so the task is done again after `kb resume`
                attempt = replace(task, key=f"{task.key}/failed/{len(state.resumes)}")  # keys of its own
                failed = GenerationFailed(task=task.kind, error=str(e).splitlines()[0])
                out.append(self.new(state, failed, attempt.key))
                out.append(self.charge(state, attempt, gpu_s=busy, wall_s=time.perf_counter() - t0))
                return out
            except generators.GenerationError as e:
                note = str(e)
        slots = cfg.max_candidates - len(state.candidates)
        proposed: list[str] = []
        duplicates = 0
        round_no = 0 if parent is None else parent.proposal.round + 1
        for p in proposals:
            tokens += p.tokens
            source_hash = self.store.put_blob(p.source)
            cid = source_hash[:16]
            if cid in state.candidates or cid in proposed:
                duplicates += 1
                continue
            if len(proposed) >= slots:
                break
            proposed.append(cid)
            event = CandidateProposed(
                candidate=cid,
                source=source_hash,
                parent=parent.id if parent else None,
                generator=gen.name,
                family=p.family,
                strategy=p.strategy,
                knobs=p.knobs,
                round=round_no,
                hint=p.hint,
                diagnosis=p.diagnosis,
                prompt=self.store.put_blob(p.prompt) if p.prompt else None,
                reply=self.store.put_blob(p.reply) if p.reply else None,
                # never more than the user allowed: what else it runs in torch fails the gate
                torch_ops=[c for c in p.torch_ops if c in cfg.allow_torch],
                plan=p.plan,
            )
            out.append(event.to_new(state.run_id, f"{state.run_id}/propose/{cid}", self.actor, subject=cid))
        out.append(
            self.new(
                state,
                GenerationDone(task=task.kind, proposed=proposed, duplicates=duplicates, note=note),
                f"{task.key}/done",
            )
        )
        out.append(self.charge(state, task, gpu_s=busy, wall_s=time.perf_counter() - t0, tokens=tokens))
        return out
