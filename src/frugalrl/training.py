"""What a run records: its directory, counters, evaluations, checkpoints and summary.

:class:`RunRecorder` keeps the books of one run for the driver (:func:`frugalrl.driver.drive`, which owns the
loop and the cadences): seeding, the run directory, the standard metric columns, evaluations and the best
policy, atomic checkpoints (``checkpoints/latest.pt``: every attached part's ``state_dict()``, the RNG states
and the counters) and resume, progress output, and ``summary.json`` (:class:`~frugalrl.runs.RunSummary`, the
same keys for every algorithm).

Times: ``train_seconds`` leave evaluation out (``wall_seconds`` include it); both add up over resumes. The
``time`` column of ``metrics.jsonl`` and ``eval_history`` are training seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch

from frugalrl.config import RunConfig
from frugalrl.envs.checkpoint import resume_envs
from frugalrl.evaluation import (
    RECHECK_SEED,
    Evaluation,
    EvaluationEnvError,
    EvaluationInterrupted,
    Evaluator,
    PolicyEvaluator,
    evaluation_disagreement,
    evaluation_regression,
    regression_recheck,
)
from frugalrl.rng import GeneratorState, rng_state, seed_everything, set_rng_state
from frugalrl.runs import (
    BEST,
    RunDirectory,
    RunSummary,
    UpdateRows,
    jsonable,
    read_checkpoint,
    read_config,
    slug,
)
from frugalrl.sync_state import StallWatch

log = logging.getLogger("frugalrl")

CHECKPOINT_FORMAT = 1
MIN_LATE_EPISODES = 5
"""Training episodes of the run's last fifth that the final evaluations are checked against, at least."""
_NOT_COMPARED = {"progress", "tensorboard", "log_every_s", "plots", "run_dir", "run_name", "total_timesteps", "_meta", "algo", "sources"}


class Stateful(Protocol):
    """What can be attached to a run: anything with ``state_dict()`` and ``load_state_dict()`` (and, if it follows
    the episodes in progress, ``episodes_restarted(envs)``: a resume could not restore those envs, None: all)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class RunRecorder:
    """The books of one run of one algorithm: see the module docstring.

    ``tag`` is part of the default run name; ``resume`` is a run directory to continue.
    """

    def __init__(self, algo: str, cfg: RunConfig, *, tag: str = "", resume: str | Path | None = None) -> None:
        cfg.validate()
        self.algo = algo
        self.cfg = cfg
        seed_everything(cfg.seed)
        torch.set_num_threads(cfg.torch_threads)
        self._checkpoint: dict[str, Any] | None = None
        self._resumed = resume is not None
        config = {"algo": algo, **jsonable(dataclasses.asdict(cfg))}
        if resume is not None:
            path = Path(resume)
            self._checkpoint = read_checkpoint(path)
            saved = read_config(path)
            if self._checkpoint.get("algo") != algo or saved.get("algo", algo) != algo:
                raise ValueError(f"{path} is a {self._checkpoint.get('algo')} run; it cannot be resumed as {algo}")
            changed = sorted(k for k in config if k not in _NOT_COMPARED and saved.get(k, config[k]) != config[k])
            if changed:
                log.warning("frugalrl: resuming %s with other settings than its last segment: %s", path,
                            ", ".join(f"{k}={config[k]!r} (was {saved.get(k)!r})" for k in changed))
            self.directory = RunDirectory(path, {**config, "_meta": saved.get("_meta", {})}, cfg.tensorboard,
                                          resume_step=int(self._checkpoint["counters"]["env_steps"]))
        else:
            self.directory = RunDirectory(self._new_dir(tag), config, cfg.tensorboard)
        self.env_steps = 0
        self.updates = 0
        self.schedule_offset = 0
        """Updates the schedules count beyond :attr:`updates` (set by the driver when a resume changed their size)."""
        self.episodes = 0
        self.stopped = False
        self.stop_reason = "budget"
        self.time_to_target: dict[str, Any] | None = None
        self.eval_history: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self._recent: deque[tuple[float, int]] = deque(maxlen=100)
        """The last 100 training episodes: (return, env steps at the update that reported it)."""
        self._lag_sum = 0.0
        self._lag_n = 0
        self.rows = UpdateRows(self.directory, cfg.log_every_s)
        self._parts: dict[str, Stateful | None] = {}
        self._evaluate: Evaluator | None = None
        self._evaluate_stochastic: Evaluator | None = None
        self._stop_signal: Callable[[], str | None] = lambda: None
        self._last_eval: Evaluation | None = None
        self._last_stochastic: Evaluation | None = None
        self._eval_seconds = 0.0
        self._cut_warned = False  # evaluation episodes reached eval_max_steps: said once
        self._past_seconds = 0.0
        self._t0 = time.monotonic()
        self._saved_at = 0.0  # training seconds at the last checkpoint
        counters = None if self._checkpoint is None else self._checkpoint["counters"]
        self.resumed_from = None if counters is None else (int(counters["env_steps"]), int(counters["updates"]))
        """The env steps and updates of the checkpoint resumed from; None: a new run."""
        self.saved_step = None if self.resumed_from is None else self.resumed_from[0]
        """The env step of the last checkpoint written (or resumed from); None: none yet."""
        self.new_best = False
        """Whether the latest evaluation is the run's best so far (the driver then checkpoints)."""
        self._bar: Any = None
        self._bar_name = f"{algo} {cfg.env.split(':')[-1]}"
        self.stall_watch = StallWatch()
        """Notices a sync rule that leaves the workers on an old policy while training stops improving."""

    @property
    def dir(self) -> Path:
        """The run directory."""
        return self.directory.dir

    @property
    def resumed(self) -> bool:
        """Whether this run continues a checkpoint."""
        return self._resumed

    @property
    def last_stochastic(self) -> Evaluation | None:
        """The sampling evaluation made beside the latest deterministic one (None: none was made)."""
        return self._last_stochastic

    @property
    def checkpointing(self) -> bool:
        """Whether checkpoints are written during the run (parts then need to be restorable exactly)."""
        return self.cfg.checkpoint_every > 0 or self.cfg.checkpoint_every_s is not None

    def checkpoint_due(self) -> bool:
        """Whether ``checkpoint_every_s`` seconds of training have passed since the last checkpoint (or the start)."""
        every = self.cfg.checkpoint_every_s
        return every is not None and self.seconds() - self._saved_at >= every

    def _new_dir(self, tag: str) -> Path:
        cfg = self.cfg
        if cfg.run_name:  # a run with a checkpoint is never written over (one that never saved one: it is)
            path = Path(cfg.run_dir) / cfg.run_name
            if (path / "checkpoints" / "latest.pt").exists():
                raise ValueError(f"{path} already holds a run: continue it with  frugalrl train {self.algo} --resume "
                                 f"{path}  or give another --run-name (or remove the directory)")
            return path
        env = cfg.env_kwargs.get("env_id", cfg.env) if isinstance(cfg.env_kwargs, dict) else cfg.env
        parts = [self.algo, slug(str(env).split(":")[-1]), slug(tag), f"s{cfg.seed}", time.strftime("%Y%m%d-%H%M%S")]
        base = Path(cfg.run_dir) / "-".join(p for p in parts if p)
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        return path

    # ------------------------------------------------------------------ setup
    def attach(self, **parts: Any) -> None:
        """Register what a checkpoint holds: objects with ``state_dict``/``load_state_dict``, or a
        ``torch.Generator``. ``agent`` is the policy ``frugalrl eval`` scores. None entries are skipped."""
        for name, part in parts.items():
            self._parts[name] = GeneratorState(part) if isinstance(part, torch.Generator) else part

    def begin(self, evaluate: Evaluator | None, total_steps: int, evaluate_stochastic: Evaluator | None = None,
              stop_signal: Callable[[], str | None] | None = None) -> None:
        """Restore the checkpoint when resuming (after the parts are built: building consumed the RNG as
        it did in the first run), start the clocks and the progress bar.

        ``evaluate``: the (deterministic) evaluation of the schedule and the end; ``evaluate_stochastic``: one
        beside each, sampling actions; ``total_steps``: the progress bar's end; ``stop_signal``: the stop reason of
        a signal that came (None: none), which cuts a :class:`PolicyEvaluator`'s evaluation short."""
        self._evaluate = evaluate
        self._evaluate_stochastic = evaluate_stochastic
        if stop_signal is not None:
            self._stop_signal = stop_signal
        if self._checkpoint is not None:
            self._restore(self._checkpoint)
            self._checkpoint = None
        if self.cfg.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=self.env_steps, unit="step", unit_scale=True,
                             dynamic_ncols=True, desc=self._bar_name)
        self._t0 = time.monotonic()
        self._saved_at = self.seconds()  # a resumed run's clock goes on from its checkpoint

    def _restore(self, ckpt: dict[str, Any]) -> None:
        if ckpt.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"checkpoint format {ckpt.get('format')!r} is not {CHECKPOINT_FORMAT}")
        envs_state: Any = "reset"  # no envs attached (a plain vector env): they start anew
        for name, part in self._parts.items():
            state = ckpt["parts"].get(name)
            if part is None:
                if state is not None:  # e.g. --no-norm-value on resume: what the saved part held is not used
                    log.warning("frugalrl: the checkpoint's %r is not used by this run's settings (changed on "
                                "resume?): it is dropped", name)
                continue
            if name == "envs":
                envs_state = resume_envs(part, state, seed=self.cfg.seed + 1_000_003 * (len(ckpt["counters"]["resumes"]) + 1))
                continue
            if state is None and hasattr(part, "state_when_missing"):  # a part newer than the checkpoint
                state = part.state_when_missing(ckpt["counters"])
            if state is None:
                raise ValueError(f"the checkpoint has no {name!r} to resume from")
            part.load_state_dict(state)
        if envs_state != "restored":  # parts that follow the episodes in progress (a return scaler's returns) restart
            restarted = None if envs_state == "reset" else envs_state  # all envs, or those not rebuilt exactly
            for part in self._parts.values():
                getattr(part, "episodes_restarted", lambda envs: None)(restarted)
        c = ckpt["counters"]
        self.env_steps, self.updates, self.episodes = int(c["env_steps"]), int(c["updates"]), int(c["episodes"])
        self.saved_step = self.env_steps
        returns = c["recent_returns"]
        self._recent.extend(zip(returns, c.get("recent_steps", [self.env_steps] * len(returns)), strict=True))
        self._lag_sum, self._lag_n = float(c["lag_sum"]), int(c["lag_n"])
        self._past_seconds, self._eval_seconds = float(c["seconds"]), float(c["eval_seconds"])
        self.eval_history = list(c["eval_history"])
        if self.eval_history:  # the summary of a run resumed right after its last evaluation reports that one
            e = self.eval_history[-1]
            self._last_eval = Evaluation(e["mean"], e["std"], int(e.get("episodes", 1)))
            if c.get("last_stochastic") is not None:  # and its sampling one (the summary's), not played again
                self._last_stochastic = Evaluation(**c["last_stochastic"], deterministic=False)
        self.time_to_target = c.get("time_to_target")
        self.stall_watch.events = list(c.get("sync_stalls", []))
        self.resumes = list(c["resumes"]) + [{"step": self.env_steps, "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                               "envs": envs_state}]
        set_rng_state(ckpt["rng"])

    # ------------------------------------------------------------------ the loop
    def seconds(self) -> float:
        """Training seconds so far (evaluation excluded, earlier segments included)."""
        return self._past_seconds + (time.monotonic() - self._t0) - self._eval_seconds

    def _recent_mean(self) -> float | None:
        """The mean return of the last 100 training episodes (None before the first)."""
        return float(np.mean([r for r, _ in self._recent])) if self._recent else None

    def _late_train_return(self) -> float | None:
        """The mean return of the recent training episodes reported in the last fifth of the run so far, what the
        evaluations are checked against (:func:`~frugalrl.evaluation.evaluation_disagreement`); None under
        :data:`MIN_LATE_EPISODES` of them. In a short run, or one of long episodes, the last 100 episodes reach back
        to a policy far from the learner's; they would make a policy that learned look contradicted."""
        late = [r for r, s in self._recent if s > 0.8 * self.env_steps]
        return float(np.mean(late)) if len(late) >= MIN_LATE_EPISODES else None

    def record_update(self, steps: int, row: dict[str, Any], *, updates: int = 1, episode_returns: Iterable[float] = (),
                      episode_lengths: Iterable[int] = (), policy_lag: np.ndarray | None = None,
                      cluster: Any = None) -> dict[str, Any]:
        """Count ``updates`` learner updates that consumed ``steps`` env steps and return their metrics row: ``row``
        plus the standard columns (steps/s, training return and length, policy lag, and a ClusterEnv's bytes,
        syncs and KLs)."""
        self.updates += updates
        self.env_steps += int(steps)
        returns = [float(r) for r in episode_returns]
        lengths = list(episode_lengths)
        self.episodes += len(returns)
        self._recent.extend((r, self.env_steps) for r in returns)
        self.rows.episodes(returns, lengths)
        row = dict(row)
        row["charts/sps"] = self.env_steps / max(self.seconds(), 1e-9)
        if returns:
            row["train/episode_return"] = float(np.mean(returns))
        if lengths:
            row["train/episode_length"] = float(np.mean(lengths))
        lag = policy_lag
        if lag is not None and lag.size:
            self._lag_sum += float(lag.sum())
            self._lag_n += int(lag.size)
            row["charts/policy_lag"] = float(lag.mean())
        if cluster is not None and hasattr(cluster, "stats"):
            self._cluster_columns(row, cluster, lag)
        return row

    def _cluster_columns(self, row: dict[str, Any], cluster: Any, lag: np.ndarray | None) -> None:
        st = cluster.stats()
        if lag is not None and lag.size:
            # A rule that bounds the lag (AAPS's max lag, an interval) keeps the data fresher than that by
            # design: only a lag beyond the bound is a stall.
            rule = getattr(cluster, "sync_rule", None)
            bound = None if rule is None else rule.lag_bound
            self.stall_watch.min_lag = max(10.0, float(bound or 0))
            stall = self.stall_watch.observe(self.env_steps, float(lag.mean()), row.get("train/episode_return"),
                                             st["sync_rule"])
            if stall is not None:
                log.warning("frugalrl: %s", stall)
                row["health/sync_stall"] = 1
        row["syncs/total"] = st["weight_syncs"]["total"]
        for kind, n in st["bytes"].items():  # every kind that moved (the bytes-per-step plot splits by kind)
            if isinstance(n, int) and kind != "messages" and (n or kind in ("total", "weights")):
                row[f"bytes/{kind}"] = n
        kls = [k for k in st["last_kl"] if k is not None]
        if kls:
            row["syncs/kl_mean"] = float(np.mean(kls))
            row["syncs/kl_max"] = float(max(kls))
            for w, k in enumerate(st["last_kl"][:16]):  # per worker (the first 16: one column each)
                if k is not None:
                    row[f"syncs/kl/{w}"] = k

    def show_progress(self, steps: int, row: dict[str, Any], postfix: dict[str, Any] | None = None) -> None:
        """Advance the progress bar by ``steps`` env steps, with the row's headline figures."""
        if self._bar is None:
            return
        mean = self._recent_mean()
        post = {"ret": "-" if mean is None else f"{mean:.1f}", "sps": f"{row['charts/sps']:.0f}"}
        if "syncs/total" in row:
            post["syncs"] = row["syncs/total"]
        if self._last_eval is not None:
            post["eval"] = f"{self._last_eval.mean:.1f}"
        post.update(postfix or {})
        self._bar.set_postfix(post, refresh=False)
        self._bar.update(int(steps))

    def stop(self, reason: str) -> None:
        """End the run after this update, for ``reason`` (the summary's ``stop_reason``)."""
        self.stopped = True
        self.stop_reason = reason

    def log(self, row: dict[str, Any], step: int | None = None, seconds: float | None = None) -> None:
        """Log an extra row (a fault, a monitor event) at ``step`` (default: the current env step)."""
        self.directory.log(self.env_steps if step is None else step, self.seconds() if seconds is None else seconds, row)

    def log_update(self, row: dict[str, Any], keep: bool = False) -> None:
        """Log the row of the update just recorded (:class:`~frugalrl.runs.UpdateRows`: written now if ``keep``, an
        evaluation or a stop, or ``cfg.log_every_s`` after the last; else held for a later one or the end)."""
        self.rows.add(self.env_steps, self.seconds(), row, keep)

    def set_clock(self, seconds: float) -> None:
        """Set the training seconds so far, for an algorithm that measures them itself (a server's optimisation
        time, without its workers' start-up)."""
        self._past_seconds = seconds + self._eval_seconds - (time.monotonic() - self._t0)

    def evaluate(self) -> Evaluation:
        """Evaluate now (timed apart from training): deterministically, and sampling actions too when the run
        has a stochastic evaluator and ``cfg.eval_stochastic``; record both; stop if it reaches the target.
        Raises :class:`~frugalrl.evaluation.EvaluationInterrupted` (nothing recorded) if a stop signal comes."""
        if self._evaluate is None:
            raise RuntimeError("this run has no evaluator")
        seconds = self.seconds()
        result = self._play(self._evaluate)
        stochastic = None
        if self._evaluate_stochastic is not None and self.cfg.eval_stochastic:
            stochastic = self._play(self._evaluate_stochastic)
        self.record_eval(result, self.env_steps, seconds, stochastic=stochastic)
        return result

    def _play(self, evaluator: Evaluator, compare_with: dict[str, Any] | None = None) -> Any:
        """``evaluator``'s evaluation (or :meth:`PolicyEvaluator.compare` against ``compare_with``), timed apart from
        training. A PolicyEvaluator shows its episodes on the progress bar and stops as soon as a signal comes."""
        t0, shown = time.monotonic(), [-1]

        def poll(done: int) -> None:  # shown once it has taken a second: a quick one would only fill logs
            if (reason := self._stop_signal()) is not None:
                raise EvaluationInterrupted(reason)
            if self._bar is not None and done != shown[0] and time.monotonic() - t0 > 1.0:
                shown[0] = done
                self._bar.set_description_str(f"{self._bar_name} ({kind}: {done} episodes done)")

        try:
            if not isinstance(evaluator, PolicyEvaluator):
                return evaluator()
            kind = "recheck" if compare_with is not None else "eval" if evaluator.deterministic else "sampling"
            if compare_with is not None:
                return evaluator.compare(compare_with, RECHECK_SEED + self.cfg.seed, poll)
            return evaluator(poll=poll)
        finally:
            self._eval_seconds += time.monotonic() - t0
            if self._bar is not None and shown[0] >= 0:
                self._bar.set_description_str(self._bar_name)

    def record_eval(self, result: Evaluation, step: int, seconds: float, stochastic: Evaluation | None = None,
                    **extra: Any) -> None:
        """Record an evaluation (also one made elsewhere: HSA2C's server-side ones); stop at the target.

        The history entry holds the deterministic ``mean``/``std``, the sampling one (``stochastic_mean``/``std``)
        if given, the training return of the moment (``train_return``: the last 100 training episodes) and,
        when they contradict each other, ``disagreement`` (see :func:`evaluation_disagreement`). ``extra``
        (e.g. ``global_update``) goes into the history entry and ``time_to_target``."""
        self._last_eval, self._last_stochastic = result, stochastic
        entry: dict[str, Any] = {"step": int(step), "seconds": round(seconds, 3), "mean": result.mean, "std": result.std,
                                 "episodes": result.episodes}
        if stochastic is not None:
            entry.update(stochastic_mean=stochastic.mean, stochastic_std=stochastic.std)
        cut = result.cut + (stochastic.cut if stochastic is not None else 0)
        if cut:
            entry["cut_episodes"] = cut
            self._warn_cut(cut, result.episodes + (stochastic.episodes if stochastic is not None else 0))
        train = self._recent_mean()
        if train is not None:
            entry["train_return"] = train
            disagreement = evaluation_disagreement(result, stochastic, self._late_train_return())
            if disagreement is not None:
                entry["disagreement"] = disagreement["message"]
        self.new_best = all(result.mean > e["mean"] for e in self.eval_history)
        if self.new_best:
            self._save_best({**entry, **extra})
        self.eval_history.append({**entry, **extra})
        target = self.cfg.target_return
        if target is not None and result.mean >= target and self.time_to_target is None:
            self.time_to_target = {"step": int(step), "seconds": round(seconds, 3), **extra}
            self.stop("target_return")

    def _warn_cut(self, cut: int, episodes: int) -> None:
        """Say once per run that evaluation episodes reach the step cap: their returns are partial."""
        if self._cut_warned:
            return
        self._cut_warned = True
        log.warning("frugalrl: %d of %d evaluation episodes at step %d were cut at eval_max_steps=%d before they "
                    "ended (the env has no time limit of its own?): their returns are partial; --eval-max-steps "
                    "sets the cap", cut, episodes, self.env_steps, self.cfg.eval_max_steps)

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        """Write the checkpoint (atomically), and the update row held back till then (a resume starts after it)."""
        self.rows.flush()
        parts = {name: (None if part is None else self._part_state(name, part)) for name, part in self._parts.items()}
        payload: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "algo": self.algo,
            "parts": parts,
            "rng": rng_state(),
            "counters": {
                "env_steps": self.env_steps, "updates": self.updates, "episodes": self.episodes,
                "recent_returns": [r for r, _ in self._recent], "recent_steps": [s for _, s in self._recent],
                "lag_sum": self._lag_sum, "lag_n": self._lag_n,
                "seconds": self._past_seconds + (time.monotonic() - self._t0), "eval_seconds": self._eval_seconds,
                "eval_history": self.eval_history, "time_to_target": self.time_to_target, "resumes": self.resumes,
                "sync_stalls": self.stall_watch.events, "last_stochastic": None if (e := self._last_stochastic) is None
                else {"mean": e.mean, "std": e.std, "episodes": e.episodes},  # beside the history's last entry
            },
        }
        agent = self._parts.get("agent")
        if agent is not None and hasattr(agent, "spec"):
            payload["spec"] = agent.spec.to_json()
        self._saved_at = self.seconds()
        path = self.directory.save_checkpoint(payload)
        self.saved_step = self.env_steps
        return path

    def _final_evaluations(self, evaluate: bool, always: bool) -> tuple[Evaluation | None, Evaluation | None]:
        """The run's last evaluations, deterministic and sampling: made now (if ``evaluate``) unless the cadence
        made them at the last step (``always``: make the deterministic one anyway)."""
        cfg = self.cfg
        last = self._last_eval
        at_end = bool(self.eval_history) and self.eval_history[-1]["step"] == self.env_steps
        if evaluate and self._evaluate is not None and cfg.eval_episodes > 0 and (always or not at_end):
            reason = self.stop_reason
            last = self.evaluate()
            self.stop_reason = reason  # the run stopped for its own reason, whatever this evaluation says
            self.directory.log(self.env_steps, self.seconds(), {"eval/return_mean": last.mean, "eval/return_std": last.std})
        fresh = bool(self.eval_history) and self.eval_history[-1]["step"] == self.env_steps
        stochastic = self._last_stochastic if fresh else None  # the cadence's, when it ran at the last step
        if evaluate and stochastic is None and self._evaluate_stochastic is not None and cfg.eval_episodes > 0:
            stochastic = self._play(self._evaluate_stochastic)  # in the summary (the metrics keep one row per step)
            if stochastic.cut:
                self._warn_cut(stochastic.cut, stochastic.episodes)
        return last, stochastic

    def _save_best(self, entry: dict[str, Any]) -> None:
        """Write ``checkpoints/best.pt``: the attached agent (which holds the weights just evaluated) with its spec,
        for ``frugalrl eval RUN --checkpoint best``; nothing for a run without one (the split pipeline model)."""
        agent = self._parts.get("agent")
        if agent is None or not hasattr(agent, "spec"):
            return
        t0 = time.monotonic()
        self.directory.save_checkpoint({"format": CHECKPOINT_FORMAT, "algo": self.algo, "spec": agent.spec.to_json(),
                                  "parts": {"agent": agent.state_dict()},
                                  "counters": {"env_steps": entry["step"], "evaluation": entry}}, BEST)
        self._eval_seconds += time.monotonic() - t0

    def _recheck(self, regression: dict[str, Any]) -> dict[str, Any] | None:
        """``regression`` with the ``recheck`` that confirmed it, None if the recheck did not (see
        :func:`~frugalrl.evaluation.regression_recheck`), unchanged without ``best.pt`` or a :class:`PolicyEvaluator`."""
        evaluator, path = self._evaluate, self.directory.checkpoints / BEST
        if not isinstance(evaluator, PolicyEvaluator) or evaluator.episodes < 2 or not path.exists():
            return regression
        recheck = regression_recheck(*self._play(evaluator, read_checkpoint(path)["parts"]["agent"]))
        if not recheck["confirmed"]:
            log.info("frugalrl: the final evaluation is below the best one, but %s: the best one was lucky",
                     recheck["message"])
            return None
        return {**regression, "recheck": recheck, "message": f"{regression['message']}; {recheck['message']}"}

    @staticmethod
    def _part_state(name: str, part: Stateful) -> Any:
        if name == "envs":  # envs that cannot be rebuilt exactly (or whose workers failed) keep their books only
            return cast(Any, part).state_dict(workers=getattr(part, "replayable", False)
                                              and not getattr(part, "closed", False))
        return part.state_dict()

    # ------------------------------------------------------------------ the end
    def finish(self, details: dict[str, Any] | None = None, traffic: dict[str, Any] | None = None,
               always_evaluate: bool = False, evaluate: bool = True, checkpoint: bool = True) -> dict[str, Any]:
        """Final evaluation (unless an evaluation was made at the last step, e.g. the one that reached the
        target; ``always_evaluate`` makes one anyway; ``evaluate=False`` none, nor the recheck of a regression:
        a stop on a signal), final checkpoint (unless ``checkpoint=False``: a run that could not start),
        summary.json and plots; returns the summary as a dict.

        ``traffic``: ``bytes``, ``weight_syncs``, ``restarts`` and ``uplink`` (the experience codecs per stream,
        put in ``details``; see :func:`frugalrl.driver.cluster_traffic`).
        """
        self.rows.flush()
        cfg = self.cfg
        try:
            last, stochastic = self._final_evaluations(evaluate, always_evaluate)
            self._last_stochastic = stochastic if self.eval_history else None  # saved: a resume reports it
        except EvaluationInterrupted as e:
            if self.stop_reason == "budget":  # not ended yet: its resumption evaluates, as a signal stop's
                self.stop_reason = str(e)
            evaluate, last, stochastic = False, self._last_eval, None
            log.warning("frugalrl: a stop signal cut the final evaluation short: the run is saved without it")
        except EvaluationEnvError as e:  # trained to the end all the same: saved, the summary says why unevaluated
            evaluate, last, stochastic = False, self._last_eval, None
            details = {**(details or {}), "warnings": [*(details or {}).get("warnings", []), f"the end: {e}"]}
            log.warning("frugalrl: the final evaluation failed: %s; the run is saved without it", e)
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if checkpoint:
            self.save()
        seconds = self.seconds()
        wall = seconds + self._eval_seconds
        traffic = traffic or {}
        train_mean = self._recent_mean()
        disagreement = evaluation_disagreement(last, stochastic, self._late_train_return())
        earlier = [e["step"] for e in self.eval_history[:-1] if e.get("disagreement")]
        if disagreement is not None:
            disagreement["earlier_evaluations"] = earlier  # the steps of cadence evaluations that disagreed too
            log.warning("frugalrl: %s", disagreement["message"])
        regression = evaluation_regression(self.eval_history)
        best = self.directory.checkpoints / BEST
        if regression is not None and evaluate:
            try:
                regression = self._recheck(regression)
            except (EvaluationInterrupted, EvaluationEnvError):  # reported unconfirmed, as after a signal stop
                pass
        if regression is not None:
            if best.exists():
                regression["message"] += f"; the policy of that evaluation is {best} (frugalrl eval {self.directory.dir} --checkpoint best)"
            log.warning("frugalrl: %s", regression["message"])
        # A run stopped by a signal has not ended: its resumption is judged when it does.
        stale = self.stall_watch.at_end(self.env_steps) if evaluate else None
        if stale is not None:
            log.warning("frugalrl: %s", stale)
        summary = RunSummary(
            algo=self.algo,
            env_id=str(cfg.env_kwargs.get("env_id", cfg.env)),
            seed=cfg.seed,
            env_steps=self.env_steps,
            updates=self.updates,
            wall_seconds=round(wall, 3),
            train_seconds=round(seconds, 3),
            steps_per_second=round(self.env_steps / max(seconds, 1e-9), 1),
            eval_return_mean=last.mean if last is not None else math.nan,
            eval_return_std=last.std if last is not None else math.nan,
            eval_episodes=last.episodes if last is not None else 0,
            eval_deterministic=last.deterministic if last is not None else True,
            stochastic_return_mean=None if stochastic is None else stochastic.mean,
            stochastic_return_std=None if stochastic is None else stochastic.std,
            eval_history=self.eval_history,
            train_return_mean_last100=train_mean,
            episodes=self.episodes,
            stop_reason=self.stop_reason,
            target_return=cfg.target_return,
            time_to_target=self.time_to_target,
            weight_syncs=traffic.get("weight_syncs", {"total": 0, "per_worker": []}),
            bytes=traffic.get("bytes", {"total": 0}),
            restarts=int(traffic.get("restarts", 0)),
            policy_lag_mean=self._lag_sum / self._lag_n if self._lag_n else None,
            resumes=self.resumes,
            sync_stalls=self.stall_watch.events,
            eval_disagreement=disagreement,
            eval_regression=regression,
            run_dir=str(self.directory.dir),
            details={**(details or {}), **({"uplink": traffic["uplink"]} if "uplink" in traffic else {})},
        ).to_json()
        self.directory.write_summary(summary)
        self.directory.close()
        if cfg.plots:
            from frugalrl.plots import make_plots

            make_plots(self.directory.dir)
        return summary

