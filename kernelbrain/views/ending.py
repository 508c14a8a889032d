"""How a run ended, as its last lines and the exit code of `kb run` and `kb resume` (README): 0 with a
winner, EXIT_NO_KERNEL when it finished with none, EXIT_PROBLEM when the problem cannot be evaluated,
EXIT_WAITING when it stopped unfinished on a passing fault (the generator's service, or a worker that
kept dying on a task) with nothing else left to do (resumable), EXIT_STORE when its database failed
under it (it cannot be written, or stayed unreachable; resumable once fixed), EXIT_BUSY when another
live process drives the run (nothing done), EXIT_INTERRUPTED when it was stopped before finishing
(resumable).

The lines go through views.lines: a reader of stdout that has left (a pipe's tee stopped by the same
Ctrl-C) costs none of them."""

from __future__ import annotations

import click

from kernelbrain.core.events import RunFinished
from kernelbrain.core.policy import stalled
from kernelbrain.core.problem import RANDOM_IN_EVAL, RANDOM_IN_TRAINING, TOO_BIG
from kernelbrain.core.state import RunState
from kernelbrain.views import lines

EXIT_NO_KERNEL = 3
EXIT_PROBLEM = 4
EXIT_WAITING = 5
EXIT_STORE = 6
EXIT_BUSY = 7
EXIT_INTERRUPTED = 130


def report(run_id: str, state: RunState, finished: RunFinished | None, as_json: bool) -> int:
    """Print how the run ended (the result line with --json); its exit code."""
    from kernelbrain.views import progress  # rich, for the commands that show a run only

    outcome = progress.result(state, finished)
    # the problem itself could not be run or traced: its fault, not the search's
    problem_fault = state.problem_fault if finished is not None else None
    if as_json:
        lines.result(progress.json_line(outcome.model_dump(mode="json")))
    if finished is None and stalled(state):
        lines.result(_waiting(run_id, state))
        return EXIT_WAITING
    if finished is None:
        click.echo(
            f"kb: run {run_id} interrupted; everything recorded is kept. Continue with: kb resume {run_id}",
            err=True,
        )
        return EXIT_INTERRUPTED
    code = 0 if finished.winner else EXIT_PROBLEM if problem_fault else EXIT_NO_KERNEL
    if as_json:
        return code
    lines.result(f"run {run_id} finished: {finished.reason}")
    if finished.winner:
        speed = ", ".join(f"{shape} {x:.3g}x" for shape, x in outcome.speedups.items())
        lines.result(
            f"winner {finished.winner} at rung {finished.winner_rung}, score "
            f"{finished.winner_score:.4g} ({speed}); `kb audit {run_id}` says why, "
            f"`kb export {run_id} -o kernel.py` writes it"
        )
    elif problem_fault and problem_fault.startswith((TOO_BIG, RANDOM_IN_TRAINING, RANDOM_IN_EVAL)):
        where = state.started.problem_path if state.started is not None else "of the run"
        verb = "is " if problem_fault.startswith(TOO_BIG) else ""
        lines.result(f"the problem file {where} {verb}{problem_fault} (exit {EXIT_PROBLEM})")
    elif problem_fault:
        where = state.started.problem_path if state.started is not None else "of the run"
        lines.result(
            f"the problem file {where} cannot be evaluated as it is ({problem_fault}); "
            f"fix it so that Model(*get_init_inputs())(*get_inputs()) runs (exit {EXIT_PROBLEM})"
        )
    elif not state.candidates:
        lines.result(f"no candidate was proposed: no kernel (exit {EXIT_NO_KERNEL})")
    else:
        lines.result(f"no candidate passed the gate and the ladder: no kernel (exit {EXIT_NO_KERNEL})")
    return code


def already_finished(run_id: str, state: RunState, as_json: bool) -> None:
    """What `kb resume` of a finished run says (it exits 0: the run is done, nothing to resume)."""
    from kernelbrain.views import progress

    assert state.finished is not None
    if as_json:
        lines.result(progress.json_line(progress.result(state, state.finished).model_dump(mode="json")))
        return
    lines.result(
        f"run {run_id} finished already: {state.finished.reason}; winner {state.finished.winner or 'none'}. "
        "Nothing to resume"
    )


def store_failed(run_id: str, error: Exception) -> int:
    """The line of a run whose database failed under it (the database's fault, not the run's); its code."""
    why = (str(error).splitlines() or [type(error).__name__])[0]
    click.echo(
        f"kb: run {run_id} stopped: its database failed ({why}). Everything recorded is kept; once it is "
        f"fixed: kb resume {run_id} (exit {EXIT_STORE})",
        err=True,
    )
    return EXIT_STORE


def _waiting(run_id: str, state: RunState) -> str:
    """The line of a run that stopped with only parked tasks left: what each waits for."""
    parts = []
    if gen := state.parked():
        why = "; ".join(f"{e.task}: {e.error}" for e in gen)
        parts.append(f"is waiting for its generator ({why})")
    if tasks := state.parked_tasks():
        prefix = f"{run_id}/"
        why = "; ".join(f"{e.task.removeprefix(prefix)}: {e.error}" for e in tasks)
        parts.append(
            f"set aside {len(tasks)} task(s) its {'/'.join(sorted({e.role for e in tasks}))} worker kept "
            f"dying on ({why}; kb's fault: its output above says more)"
        )
    return (
        f"kb: run {run_id} {' and '.join(parts)}; everything recorded is kept. Once fixed: "
        f"kb resume {run_id} (exit {EXIT_WAITING})"
    )
