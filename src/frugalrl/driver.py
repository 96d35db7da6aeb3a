"""The one training loop: every algorithm runs through :func:`drive`.

An :class:`Algorithm` says only what is its own: how to build its parts (:meth:`Algorithm.setup`) and one
update (:meth:`Algorithm.update`). The driver owns the rest, once: seeding and the run directory (through
:class:`~frugalrl.training.RunRecorder`), the loop, the evaluation schedule and the target stop, checkpoints and
resume, progress, user callbacks (:class:`Callback`) and the summary. Adding an algorithm is one module with an
``Algorithm`` subclass and a line in :data:`frugalrl.algos.ALGORITHMS`; ``tests/test_driver.py`` shows a toy one.

The order is what makes a resumed run exact, so the driver keeps it for everyone: seed, build the parts (which
consumes the RNG as it did in the first run), restore the checkpoint, then :meth:`Algorithm.start`. SIGTERM (a
scheduler's preemption) and SIGINT stop a run after the update in progress (after the first update when they
come before it), with its checkpoint and summary (``stop_reason`` "preempted" / "interrupted"); a second one exits
at once.
"""

from __future__ import annotations

import errno
import logging
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from frugalrl import presets
from frugalrl.config import RunConfig
from frugalrl.envs.restarts import WorkersFailed
from frugalrl.envs.worker import WorkerError
from frugalrl.evaluation import Evaluation, EvaluationEnvError, EvaluationInterrupted, Evaluator
from frugalrl.training import RunRecorder

log = logging.getLogger("frugalrl")

STOP_SIGNALS = {signal.SIGTERM: "preempted", signal.SIGINT: "interrupted"}
"""The signals that stop a run cleanly, and the ``stop_reason`` each leaves in its summary."""
EXIT_PREEMPTED = 75
"""The exit code of ``frugalrl train`` after a SIGTERM stop (EX_TEMPFAIL: the run is whole and resumable, so a
wrapper can requeue it); a SIGINT stop exits with 0 (a stop on request)."""
_early: list[int] = []  # stop signals that came before a run's StopSignals took over (note_stop_signals_early)


def note_stop_signals_early() -> None:
    """From now until a run's :class:`StopSignals` takes over, SIGTERM and SIGINT are noted, not fatal; the run then
    stops after its first update. For a process that starts a run after a slow start-up (a pipeline stage), so that
    a scheduler's preemption during it still ends in a checkpoint (main thread only)."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, lambda signum, _frame: _early.append(signum))


@dataclass
class Setup:
    """What an algorithm built, as the driver needs it."""

    parts: dict[str, Any]
    """What a checkpoint holds: objects with ``state_dict``/``load_state_dict``, or ``torch.Generator``s; the
    ``agent`` part is the policy that ``frugalrl eval`` scores and ``best.pt`` keeps. None entries are skipped."""
    total_updates: int | None
    """Updates in the whole run (a resumed run continues to it); None: the algorithm says when it stops (an
    asynchronous server with a time limit), through :attr:`Update.stop_reason`."""
    steps_per_update: int
    """Env steps one update consumes (the progress bar's scale)."""
    exact_steps: bool = True
    """The run takes exactly ``total_updates × steps_per_update`` env steps, and says so when that differs from
    ``total_timesteps`` (False: an asynchronous server's workers may take more)."""
    resize_on_resume: bool = True
    """A run resumed with updates of another size (another number of workers, envs, steps) goes on at the env steps
    it has done (False: at the update it has done, for an algorithm whose parts count updates themselves, as the
    split-model pipeline's two stages do)."""
    evaluate: Evaluator | None = None
    """The deterministic evaluation of the schedule and the end (None: the run is never evaluated)."""
    evaluate_stochastic: Evaluator | None = None
    """An evaluation that samples actions, made beside each deterministic one when ``eval_stochastic``."""
    cluster: Any = None
    """A ClusterEnv whose bytes, weight syncs and KLs every metrics row reports (None: no remote workers)."""
    final_evaluation: Literal["unless_fresh", "always"] = "unless_fresh"
    """'unless_fresh': the run ends with an evaluation unless one was made at its last step; 'always': it
    ends with one anyway (the algorithm's own evaluations score other weights or fewer episodes)."""


@dataclass(frozen=True)
class Step:
    """Where the run is when the driver asks for an update."""

    index: int
    """This update's number, from 1 (a resumed run continues the count; resumed with updates of another size, it
    counts the env steps done in updates of the new size: :attr:`Setup.resize_on_resume`)."""
    total: int
    """Updates in the whole run: schedules (learning rate, clip range) anneal over it (0: no budget in updates)."""
    checkpoint_after: bool
    """A checkpoint may be written right after this update (one is due, or an evaluation that may be the best): an
    algorithm that overlaps collection with learning leaves nothing in flight, so that it holds envs at rest."""


@dataclass
class Update:
    """What one update reports; the driver adds the standard columns and counts the steps."""

    steps: int
    """Env steps this update consumed."""
    row: dict[str, Any] = field(default_factory=dict)
    """The algorithm's own metrics (losses, schedules, ...), logged with the standard columns."""
    episode_returns: Sequence[float] = ()
    """Returns of the training episodes that ended in this update's experience."""
    episode_lengths: Sequence[int] = ()
    """Their lengths."""
    policy_lag: np.ndarray | None = None
    """Per transition, how many updates the acting policy was behind the learner."""
    postfix: dict[str, Any] | None = None
    """Extra figures for the progress bar."""
    updates: int = 1
    """Learner updates this report stands for (one, except for an asynchronous server that reports in batches)."""
    evaluation: Evaluation | None = None
    """An evaluation the algorithm made itself (an asynchronous server scoring its snapshots): recorded in place
    of the driver's schedule, with ``evaluation_info`` in its history entry."""
    evaluation_info: dict[str, Any] = field(default_factory=dict)
    """Extra fields of that evaluation's history entry (e.g. ``global_update``)."""
    seconds: float | None = None
    """The algorithm's own clock, in training seconds of the whole run, where it measures them itself (a
    server's optimisation time); None: the driver's clock."""
    stop_reason: str | None = None
    """Set when the algorithm ends the run itself (its server stopped): the summary's ``stop_reason``."""


class Algorithm(ABC):
    """One algorithm's own part of a run; :func:`drive` does the rest (see the module docstring).

    The driver sets :attr:`run` before :meth:`setup`; an algorithm may read it (``run.env_steps``,
    ``run.eval_history``, ``run.resumed``) and log extra rows with ``run.log``, never drive it.
    """

    name: ClassVar[str]
    """The registry name, recorded in config.json and every checkpoint."""
    run: RunRecorder
    own_envs: bool = True
    """False where the caller passed envs of its own (``cfg.env`` need not describe them)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def tag(self) -> str:
        """A word for the default run directory's name (the sync rule, the codec, ...)."""
        return ""

    @abstractmethod
    def setup(self) -> Setup:
        """Build the envs, networks and optimisers (before a checkpoint is restored into them)."""

    def start(self) -> None:  # noqa: B027 - an optional hook
        """After the restore, before the first update (reset the envs of a new run, start background work)."""

    @abstractmethod
    def update(self, step: Step) -> Update:
        """Collect experience and make one learner update."""

    def after_update(self, stopping: bool, saved: bool) -> None:  # noqa: B027 - an optional hook
        """Called at the end of each update's turn of the loop (evaluated, logged, checkpointed); ``stopping``:
        the run ends now (its target reached, a callback's stop); ``saved``: a checkpoint was just written (a remote
        half of the algorithm saves its own)."""

    def end(self) -> Update | None:
        """The last update is done: finish what is in flight before the final evaluation and checkpoint. An
        asynchronous algorithm returns what its reports did not count yet (the exact totals of its server:
        ``steps`` and ``updates`` still to add, its clock, its stop reason)."""
        return None

    def details(self) -> dict[str, Any]:
        """The algorithm's own entries of the summary's ``details``."""
        return {}

    def traffic(self) -> dict[str, Any]:
        """``bytes``, ``weight_syncs``, ``restarts`` and ``uplink`` of the run (see
        :func:`cluster_traffic`); nothing for an algorithm without a wire."""
        return {}

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what :meth:`setup` built (also after an error)."""


class Callback:
    """User hooks into the loop, as SB3's callbacks: return False from a hook to stop the run
    (``stop_reason`` "callback"); None or True goes on."""

    def on_update(self, run: RunRecorder, update: Update, row: dict[str, Any]) -> bool | None:
        """After every update, with its metrics row (logged, or held for a later row by ``log_every_s``: change a
        copy)."""
        return None

    def on_evaluation(self, run: RunRecorder, evaluation: Evaluation) -> bool | None:
        """After every scheduled evaluation."""
        return None


def cluster_traffic(envs: Any) -> dict[str, Any]:
    """The summary fields a ClusterEnv knows: bytes, weight syncs, restarts (zero traffic for other envs)."""
    from frugalrl.envs.cluster import ClusterEnv

    if not isinstance(envs, ClusterEnv):
        return {"bytes": {"total": 0}, "weight_syncs": {"total": 0, "per_worker": []}, "restarts": 0}
    st = envs.stats()
    return {"bytes": st["bytes"], "weight_syncs": st["weight_syncs"], "restarts": st["restarts"], "uplink": st["uplink"]}


def drive(algo: Algorithm, *, resume: str | Path | None = None, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Run ``algo`` to the end of its budget, its target or a callback's stop; return the summary (also written
    to ``summary.json``). ``resume``: a run directory to continue from its latest checkpoint."""
    cfg = algo.cfg
    if resume is None and algo.own_envs:
        note = presets.hand_built_note(algo.name, cfg)
        if note:
            log.warning("frugalrl: %s", note)
    run: RunRecorder | None = None
    try:  # a full disk may refuse any write, a resume's rewrite of metrics.jsonl included
        run = RunRecorder(algo.name, cfg, tag=algo.tag(), resume=resume)
        algo.run = run
        with StopSignals() as signals:
            try:
                return _loop(algo, run, callbacks, signals)
            finally:
                algo.close()
    except OSError as e:
        at = (resume, None) if run is None else (run.dir, run.saved_step)
        if (full := StorageFull.of(e, *at)) is None:
            raise
        raise full from e


class StorageFull(OSError):
    """A write of the run failed for want of space (disk full, quota, file size limit): the run stopped; its last
    checkpoint, written atomically, is intact (``step``: its env step, None: none yet)."""

    def __init__(self, error: OSError, run_dir: Path, step: int | None) -> None:
        super().__init__(error.errno, error.strerror, error.filename or str(run_dir))  # TensorBoard's name none
        self.run_dir, self.step = run_dir, step

    @staticmethod
    def of(error: OSError, run_dir: str | Path | None, step: int | None = None) -> StorageFull | None:
        """``error`` as a StorageFull if it is one of want of space in a run directory, else None."""
        full = error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk or quota on day three
        return StorageFull(error, Path(run_dir), step) if full and run_dir is not None else None


FEW_UPDATES = 10
"""A run planned for fewer updates says so at its start (64 workers on a preset's rollout make updates 32× larger
than its 2 workers, and a budget that learned becomes a handful of updates)."""


def _loop(algo: Algorithm, run: RunRecorder, callbacks: Sequence[Callback], signals: StopSignals) -> dict[str, Any]:
    cfg = algo.cfg
    try:
        setup = algo.setup()
    except WorkersFailed as e:  # no worker could start: nothing to save, but the summary says why
        run.stop("workers_failed")
        run.finish({"workers_failed": {"worker": e.worker, "errors": e.errors}}, evaluate=False, checkpoint=False)
        raise
    run.attach(**setup.parts)
    planned = (setup.total_updates or 0) * setup.steps_per_update
    if setup.exact_steps and setup.total_updates and planned != run.cfg.total_timesteps and not run.resumed:
        n = setup.total_updates
        log.warning("frugalrl: note: total_timesteps=%d is not a whole number of %d-step iterations: the run takes "
                    "%d env steps (%d iteration%s)", run.cfg.total_timesteps, setup.steps_per_update, planned, n,
                    "" if n == 1 else "s")
    if setup.total_updates is not None and setup.total_updates < FEW_UPDATES and not run.resumed:
        n = setup.total_updates
        log.warning("frugalrl: note: this budget makes %d update%s of %d env steps: the policy learns once an update, "
                    "and more workers (or envs per worker, or steps per rollout) make each one larger; a larger "
                    "--total-timesteps gives more", n, "" if n == 1 else "s", setup.steps_per_update)
    run.schedule_offset = _schedule_offset(run, setup)
    run.begin(setup.evaluate, planned, evaluate_stochastic=setup.evaluate_stochastic, stop_signal=lambda: signals.reason)
    algo.start()
    total, saved, shift = setup.total_updates, run.updates, run.schedule_offset
    failure: WorkersFailed | WorkerError | EvaluationEnvError | None = None
    # The stop is decided once per turn, before the algorithm is told of it (after_update): a signal that comes
    # later is the next turn's, so a remote half never waits for an update that does not come.
    while total is None or run.updates + shift < total:
        index = run.updates + shift + 1
        # decided before the update, so that an algorithm that overlaps collection with learning leaves nothing in
        # flight; a scheduled evaluation may become the best, which is checkpointed too
        due = cfg.checkpoints_after(index) or run.checkpoint_due()
        at_rest = due or (setup.evaluate is not None and cfg.evaluates_after(index, total or 0))
        try:
            update = algo.update(Step(index, total or 0, at_rest))
        except (WorkersFailed, WorkerError, EvaluationEnvError) as e:  # the learner is intact: save it, then report
            failure = e  # (WorkerError: an env raised, e.g. a simulator's instability on day three)
            if isinstance(e, WorkerError) and setup.cluster is not None:
                try:
                    setup.cluster.close()  # its workers stopped mid-request: the checkpoint keeps its books only
                except Exception as close_error:  # the learner is saved all the same
                    log.warning("frugalrl: closing the workers after their error failed: %s", close_error)
            run.stop("workers_failed" if isinstance(e, WorkersFailed) else "worker_error")
            break
        row = _account(run, update, setup.cluster)
        run.show_progress(update.steps, row, update.postfix)  # before an evaluation, which shows its own progress
        run.new_best = False
        try:
            evaluation = _evaluate(run, update, setup, row)
        except EvaluationEnvError as e:  # the evaluation's env raised: the run stops as for a worker's env
            failure = e
            run.log_update(row, keep=True)
            run.stop("worker_error")
            break
        if evaluation is not None and any(cb.on_evaluation(run, evaluation) is False for cb in callbacks):
            run.stop("callback")
        run.log_update(row, keep=evaluation is not None or run.stopped)
        if any(cb.on_update(run, update, row) is False for cb in callbacks) and not run.stopped:
            run.stop("callback")
        signals.stop(run)
        every = cfg.checkpoint_every
        crossed = bool(every) and (run.updates + shift) // every > (saved + shift) // every  # an update may stand for several
        ending = run.stopped or (total is not None and run.updates + shift >= total)  # the end writes its own
        checkpoint = not ending and (due or crossed or (run.new_best and cfg.checkpoint_every_s is not None))
        if checkpoint:
            run.save()
            saved = run.updates
        algo.after_update(run.stopped, checkpoint)
        if run.stopped:
            break
    try:
        last = algo.end() if failure is None else None
    except (WorkersFailed, WorkerError, EvaluationEnvError) as e:  # an asynchronous server's last updates
        failure, last = e, None
        run.stop("workers_failed" if isinstance(e, WorkersFailed) else "worker_error")
    if last is not None:
        _account(run, last, None)
    details = algo.details()
    if isinstance(failure, WorkersFailed):
        details["workers_failed"] = {"worker": failure.worker, "errors": failure.errors}
    elif failure is not None:
        details["worker_error"] = str(failure)
    # A signal asks for the checkpoint and summary within a scheduler's grace period: no final evaluation then.
    summary = run.finish(details, traffic=algo.traffic(), always_evaluate=setup.final_evaluation == "always",
                         evaluate=signals.reason is None and failure is None)
    if failure is not None:
        failure.run_dir = summary["run_dir"]
        if isinstance(failure, EvaluationEnvError):
            failure.trained = total is not None and run.updates + shift >= total
        raise failure
    return summary


class StopSignals:
    """SIGTERM and SIGINT while in this context (main thread only; a signal inherited ignored stays ignored): the
    first sets :attr:`reason` (and calls ``on_first`` with its number, e.g. to pass it on to a child); a second
    restores the previous handlers and exits at once (KeyboardInterrupt for SIGINT, SystemExit with 128 + the
    signal's number for SIGTERM), unwinding through every ``finally`` that stops workers."""

    def __init__(self, on_first: Callable[[int], object] | None = None) -> None:
        self.reason: str | None = None
        self._on_first = on_first
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # a background job (`cmd &`) keeps ignoring SIGINT
                    self._previous[sig] = signal.signal(sig, self._handle)
            if _early:  # the first one counts, as a second signal here would
                self._handle(_early[0], None)
                _early.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.reason is not None:
            self.__exit__()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.reason = STOP_SIGNALS[signal.Signals(signum)]
        log.warning("frugalrl: %s: the run stops after the update in progress (checkpoint and summary); "
                    "send it again to exit at once", signal.Signals(signum).name)
        if self._on_first is not None:
            self._on_first(signum)

    def stop(self, run: RunRecorder) -> bool:
        """Stop ``run`` if a signal came; whether it is stopped."""
        if self.reason is not None and not run.stopped:
            run.stop(self.reason)
        return run.stopped

def _account(run: RunRecorder, update: Update, cluster: Any) -> dict[str, Any]:
    """Count ``update`` on the run's books (its clock, when the algorithm keeps one; its stop) and return its
    metrics row."""
    if update.seconds is not None:
        run.set_clock(update.seconds)
    row = run.record_update(update.steps, update.row, updates=update.updates, episode_returns=update.episode_returns,
                            episode_lengths=update.episode_lengths, policy_lag=update.policy_lag, cluster=cluster)
    if update.stop_reason is not None:
        run.stop(update.stop_reason)
    return row


def _schedule_offset(run: RunRecorder, setup: Setup) -> int:
    """Updates the schedules count beyond ``run.updates``: a run resumed with updates of another size (other
    workers, envs per worker or steps) goes on at the env steps it has done, counted in updates of the new size,
    so that its budget, learning-rate and clip schedules and evaluations keep to their env steps."""
    spu = setup.steps_per_update
    if run.resumed_from is None or not (setup.exact_steps and setup.resize_on_resume and setup.total_updates):
        return 0
    steps, updates = run.resumed_from
    if steps == updates * spu:
        return 0
    shift = -(-steps // spu) - updates  # a part-update counts whole: the run never passes its budget
    if updates + shift < setup.total_updates:
        log.warning("frugalrl: the run resumes with %d-step updates (its %d updates so far made %d env steps): it goes "
                    "on as update %d of %d", spu, updates, steps, updates + shift + 1, setup.total_updates)
    return shift


def _evaluate(run: RunRecorder, update: Update, setup: Setup, row: dict[str, Any]) -> Evaluation | None:
    """Record the algorithm's own evaluation, or make the scheduled one; put it in ``row``. None also when a stop
    signal cut the scheduled one short (the run then stops without it)."""
    if update.evaluation is not None:
        run.record_eval(update.evaluation, run.env_steps, run.seconds(), **update.evaluation_info)
        row["eval/return_mean"] = update.evaluation.mean
        return update.evaluation
    if setup.evaluate is None or not run.cfg.evaluates_after(run.updates + run.schedule_offset,
                                                              setup.total_updates or 0):
        return None
    try:
        result = run.evaluate()
    except EvaluationInterrupted:
        return None
    row["eval/return_mean"], row["eval/return_std"] = result.mean, result.std
    if run.last_stochastic is not None:
        row["eval/stochastic_return_mean"] = run.last_stochastic.mean
    return result
