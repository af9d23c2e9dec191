"""What the outer loop (trainer._loop) decides between iterations: whether an evaluation is due, what the
run does after one (go on, stop, or roll back) and when it saves a checkpoint. The loop only acts.

After an evaluation two rules read what it found (run_eval.py leaves it on the run's RunEvals): reward
hacking (hacking.py), which run.on_hacking answers with warn (go on), stop, or rollback (rollback.py),
and the early stop on the trade (run.min_trade, frontier.py). An evaluation that a stop dropped stops
the run with no rule: a resume does it first. `solrl train` exits 3 ("automatic stop") when a rule
(LoopState.stopped_by_rule) ended the run short of its iterations, 130 when a stop request did.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from solrl_core.config.schema import RunConfig
from solrl_core.loop.evaluation import RunEvals
from solrl_core.runtime import distributed

# the rule named when a rollback's run.rollback_then (or MAX_ROLLBACKS) stops the run
LAST_ROLLBACK = "the last rollback"


class Next(Enum):
    GO_ON = "go on"
    STOP = "stop"  # with a checkpoint of this iteration
    ROLL_BACK = "roll back"  # to the last checkpoint evaluated clean (rollback.roll_back); with none left, STOP


@dataclass(frozen=True)
class AfterEval:
    """The run's next move after an evaluation, and the rule that stops it (LoopState.stopped_by_rule):
    '' when none does (going on, or a stop request dropped the evaluation). A rollback with no checkpoint
    to go back to stops instead, under the same rule."""

    next: Next
    rule: str = ""

    @property
    def stops(self) -> bool:
        """Whether the run stops here, once a rollback (if any) found nowhere to go."""
        return self.next is not Next.GO_ON


def evaluation_due(run: RunConfig, iteration: int, evaluates: bool) -> bool:
    """After `iteration`, for a run with eval prompts (`evaluates`): every run.eval_every and after the last."""
    return evaluates and (iteration == run.iterations or iteration % run.eval_every == 0)


def after_evaluation(run: RunConfig, evals: RunEvals, dropped: bool) -> AfterEval:
    """What the run does after the evaluation whose findings `evals` holds (`dropped`: a stop request
    dropped it, so it found nothing). The same on every rank: each finding counts when any rank made it."""
    hacked, action = distributed.any_true(evals.hacked), run.hacking_action
    ruled = hacked and action != "warn"
    rule = f"run.on_hacking={action}" if ruled and not dropped else ""
    if hacked and action == "rollback":
        return AfterEval(Next.ROLL_BACK, rule)
    short = distributed.any_true(bool(evals.short))
    if not (ruled or short or dropped):
        return AfterEval(Next.GO_ON)
    return AfterEval(Next.STOP, rule or ("run.min_trade" if short and not dropped else ""))


def checkpoint_due(run: RunConfig, iteration: int, evaluated: bool, stopping: bool, failed: bool) -> bool:
    """Whether the loop saves `iteration` when it has finished: when the run fails or stops (its last finished
    iteration is kept), after its last iteration, at every evaluation (--best and a rollback choose among
    those by their verdicts) and every run.checkpoint_every."""
    return (failed or stopping or iteration == run.iterations or evaluated
            or iteration % run.checkpoint_every == 0)
