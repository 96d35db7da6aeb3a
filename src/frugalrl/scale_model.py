"""What a ClusterEnv PPO or IMPALA run would cost at N workers: bytes and seconds per iteration, the learner's link
and CPU load, and the worker count at which either saturates (``frugalrl scale-model RUN_DIR``).

A first-order model of PPO's loop (IMPALA's overlapped one: :func:`predict`), from one run's ``summary.json``:

- every worker sends ``up`` bytes per env step and ``h`` of headers per iteration (paid per message), and receives
  ``down`` per env step plus, ``q`` times per iteration (AAPS: ``q`` < 1, not below ``1/lag_bound``: a floor the
  predictions give too), ``w`` bytes of weights, after a first full copy of ``F`` once per run of ``I`` iterations;
- an iteration is the weights going down, the workers stepping their ``E`` env steps each (in parallel, unless they
  share ``worker_cores`` cores), their fragments going up, the head's serving and the learner's update:

      s_per_iter(N) = N·(q·w + F/I)·8/L + rollout_compute · c(N)/c(W) + N·(E·up + h)·8/L + update_fixed
                      + (serve + update)_per_sample · N·E + RTT

  with c(n) = max(1, n / worker_cores) and RTT the link's round trip (one per iteration: a worker's weights ride
  in its rollout request). One run cannot tell serving (decode, KL, recompute, assembly) from waiting, nor the
  update's fixed part from its per-sample part: both are given (``benchmarks/learner_capacity.py`` measures
  serving; :meth:`RunFigures.with_update_fit` fits the update on a second run), else 0.
- Steady-state load at a worker step rate ``r`` (env steps/s per worker): the link carries N·r·(up + h/E) and
  N·r·(down + q·w/E) bytes/s (headers down included), and the learner core spends ``(serve + update)_per_sample``
  per env step; each saturates at the N where that reaches the link rate or one core.

Where given, TCP's pacing (:class:`Pacing`) and the part of a worker's step its envs do not change (:class:`StepCost`)
count too; stragglers, codec ratios and AAPS's sync rate changing with N do not (docs/multi-node.md#scale-model).
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

LINKS_GBIT = (1.0, 10.0, 25.0, 100.0)
T = TypeVar("T")


def _read_result(path: str | Path, script: str, parse: Callable[[Any], T]) -> T:
    """``parse`` of the JSON a benchmark ``script`` wrote at ``path``: one ``ValueError`` line naming the file when it
    cannot be read or parsed."""
    try:
        return parse(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a readable {script} result ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class Pacing:
    """The round trips a message of a given size takes beyond one, on a link with delay: TCP paces a message's
    segments over the round trip (docs/multi-node.md#latency). Measured by ``benchmarks/link_rtt.py`` per size, back
    to back (with CUBIC, a message after an idle spell longer than the RTO takes more: its ``after_idle`` rows);
    linear between the sizes, flat past the largest. Measured on a link without a rate limit: on a slow one, part
    of it is the serialisation the model counts already."""

    sizes: tuple[float, ...]
    extra_rtt: tuple[float, ...]

    def __post_init__(self) -> None:
        if (len(self.sizes) != len(self.extra_rtt) or not self.sizes or self.sizes[0] <= 0
                or any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False))
                or not all(x >= 0 for x in self.extra_rtt)):
            raise ValueError(f"pacing needs increasing positive sizes, each with extra round trips >= 0; got "
                             f"{self.sizes} and {self.extra_rtt}")

    @classmethod
    def from_link_rtt(cls, path: str | Path, transport: str = "tcp-bbr") -> Pacing:
        """From a ``link_rtt.py`` JSON's back-to-back rows of ``transport`` (e.g. ``tcp-bbr``, ``tcp-cubic``, ``ray``);
        rows of one size are averaged."""
        def parse(d: Any) -> Pacing:
            by_size: dict[float, list[float]] = {}
            for r in d["rows"]:
                if r["transport"] == transport:
                    by_size.setdefault(float(r["size"]), []).append(max(0.0, float(r["back_to_back_extra_rtt"])))
            if not by_size:
                raise ValueError(f"it has no rows of transport {transport!r}")
            sizes = sorted(by_size)
            return cls(tuple(sizes), tuple(sum(by_size[n]) / len(by_size[n]) for n in sizes))

        return _read_result(path, "link_rtt.py", parse)

    @classmethod
    def parse(cls, spec: str) -> Pacing:
        """From ``FILE`` or ``FILE:TRANSPORT`` (tcp-bbr by default); a ``FILE`` with a colon in its path is read whole."""
        path, sep, transport = spec.rpartition(":")
        if not sep or Path(spec).is_file() or "/" in transport or "\\" in transport:
            return cls.from_link_rtt(spec)
        return cls.from_link_rtt(path, transport or "tcp-bbr")

    def extra(self, size: float) -> float:
        """Round trips beyond one for a message of ``size`` bytes (0 for an empty one)."""
        xs, ys = (0.0, *self.sizes), (0.0, *self.extra_rtt)
        size = max(0.0, size)
        i = bisect.bisect_right(xs, size)
        if i >= len(xs):
            return ys[-1]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (size - xs[i - 1]) / (xs[i] - xs[i - 1])


@dataclass(frozen=True)
class StepCost:
    """A worker's seconds per rollout step with ``k`` envs, ``fixed_s + per_env_s · k``: the policy call and the loop
    cost the same for 2 envs as for 8, so a worker with a quarter of the envs is not 4× faster. Measured by
    ``benchmarks/worker_step_cost.py`` (one worker, alone on a core). :func:`predict` scales the measured run's
    rollout compute with it whole: head-side work in it (unless ``serve_s_per_sample`` took it out) scales too."""

    fixed_s: float
    per_env_s: float

    def __post_init__(self) -> None:
        if not (self.fixed_s >= 0 and self.per_env_s > 0):
            raise ValueError(f"a step cost needs fixed_s >= 0 and per_env_s > 0, got {self.fixed_s}, {self.per_env_s}")

    @classmethod
    def from_json(cls, path: str | Path) -> StepCost:
        """From a ``worker_step_cost.py`` JSON."""
        return _read_result(path, "worker_step_cost.py",
                            lambda d: cls(float(d["fixed_s_per_step"]), float(d["s_per_env_step"])))

    def factor(self, envs_from: float, envs_to: float) -> float:
        """How much longer a step of ``envs_to`` envs takes than one of ``envs_from``."""
        return (self.fixed_s + self.per_env_s * envs_to) / (self.fixed_s + self.per_env_s * envs_from)


@dataclass(frozen=True)
class RunFigures:
    """The per-worker figures of one measured run that the model scales."""

    workers: int
    env_steps_per_worker_iter: float
    """E: env steps each worker takes per PPO iteration (``num_steps × envs_per_worker``)."""
    up_bytes_per_step: float
    """What the workers send per env step besides message headers (experience, checkpoints)."""
    down_bytes_per_step: float
    """What the head sends per env step besides weights and message headers."""
    weight_bytes_per_sync: float
    syncs_per_worker_iter: float
    """q: weights messages per worker per iteration (1 for every-update syncs)."""
    rollout_s_per_iter: float
    update_s_per_sample: float
    link_gbit: float | None
    """The learner link of the measured run (None: unshaped, its transfer time taken as nil)."""
    serve_s_per_sample: float = 0.0
    """The head's own work per env step it takes in, besides the update (0: left out; see the module)."""
    update_s_per_iter: float = 0.0
    """The update's time per iteration that does not grow with the batch (0: none, the update linear in it)."""
    overlap: bool = False
    """The next rollout runs while the learner updates (IMPALA's rollout thread); False: PPO's sequential loop."""
    up_bytes_per_worker_iter: float = 0.0
    """Message headers each worker sends per iteration (the ``control`` kind): one set per message, however many
    env steps the message carries, so they do not shrink with a worker's envs."""
    down_bytes_per_worker_iter: float = 0.0
    """Message headers the head sends each worker per iteration (requests, the weights messages' headers)."""
    iterations: int = 0
    """The measured run's iterations (its first copies crossed its link within them; 0: not known)."""
    first_copy_bytes: float = 0.0
    """F: the full copy of the weights each worker gets first, once per run (then ``weight_bytes_per_sync`` and
    ``syncs_per_worker_iter`` are those of the syncs after it); 0: not told apart (runs before it was recorded)."""
    lag_bound: int | None = None
    """The sync rule's bound on a worker's lag in updates (AAPS's guard): a worker syncs at least once every
    ``lag_bound`` updates, whatever its KL; None: no bound (or not recorded)."""
    rtt_s: float = 0.0
    """The round-trip time of the measured run's learner link (0: none, or not known)."""
    envs_per_worker: float = 0.0
    """The measured run's envs per worker (0: not known; a :class:`StepCost` then cannot apply)."""

    @classmethod
    def from_summary(cls, summary: dict[str, Any], link_gbit: float | None = None, rtt_s: float = 0.0) -> RunFigures:
        """From a PPO or IMPALA run's ``summary.json`` (a ClusterEnv run, with its rollout and update seconds)."""
        d, b = summary.get("details", {}), summary.get("bytes", {})
        missing = [k for k in ("workers", "envs_per_worker", "num_steps", "rollout_seconds", "learner_update_seconds")
                   if k not in d]
        if summary.get("algo") not in ("ppo", "impala") or missing or not isinstance(b.get("up"), dict):
            raise ValueError(f"scale-model needs a ClusterEnv PPO or IMPALA run's summary with its timings (missing: "
                             f"{', '.join(missing) or 'bytes by direction'}); runs before this version lack them")
        steps, updates, workers = summary["env_steps"], max(1, summary["updates"]), d["workers"]
        rollouts = max(1, d.get("rollouts", updates))  # IMPALA's overlap may prefetch one it never uses
        if summary.get("resumes"):
            raise ValueError("scale-model needs a run that was not resumed (its timings cover one process)")
        weights = b["down"].get("weights", 0)
        syncs = summary["weight_syncs"]["total"]
        first = summary["weight_syncs"].get("full_bytes", 0)  # each worker's first sync is a full copy
        firsts = min(syncs, workers) if first else 0
        later, later_weights = syncs - firsts, max(0, weights - firsts * first)
        up_headers, down_headers = b["up"].get("control", 0), b["down"].get("control", 0)
        return cls(workers=workers, env_steps_per_worker_iter=steps / updates / workers,
                   up_bytes_per_step=(sum(b["up"].values()) - up_headers) / steps,
                   down_bytes_per_step=(sum(b["down"].values()) - weights - down_headers) / steps,
                   up_bytes_per_worker_iter=up_headers / updates / workers,
                   down_bytes_per_worker_iter=down_headers / updates / workers,
                   weight_bytes_per_sync=later_weights / later if later else 0.0, first_copy_bytes=float(first),
                   iterations=updates,
                   syncs_per_worker_iter=later / updates / workers,
                   rollout_s_per_iter=d["rollout_seconds"] / rollouts,
                   update_s_per_sample=d["learner_update_seconds"] / steps, link_gbit=link_gbit,
                   overlap=bool(d.get("overlap", False)), lag_bound=_lag_bound(summary), rtt_s=rtt_s,
                   envs_per_worker=float(d["envs_per_worker"]))

    @classmethod
    def from_run(cls, run_dir: str | Path, link_gbit: float | None = None) -> RunFigures:
        path = Path(run_dir) / "summary.json"
        if not path.is_file():
            raise FileNotFoundError(f"no summary.json in {run_dir}: scale-model reads a finished run directory")
        return cls.from_summary(json.loads(path.read_text()), link_gbit)

    def with_update_fit(self, other: RunFigures) -> RunFigures:
        """These figures with the update split into a fixed and a per-sample part, fitted through this run's and
        ``other``'s update time per iteration (a run of the same update at another batch size)."""
        a, b = (f.workers * f.env_steps_per_worker_iter for f in (self, other))
        ua, ub = (f.update_s_per_iter + f.update_s_per_sample * n for f, n in ((self, a), (other, b)))
        if a == b:
            raise ValueError("fitting the update needs two runs with different batch sizes (workers × env steps)")
        per_sample = max(0.0, (ub - ua) / (b - a))
        fixed = max(0.0, ua - per_sample * a)
        return replace(self, update_s_per_sample=(ua - fixed) / a, update_s_per_iter=fixed)

    def bytes_per_iter(self, workers: int, env_scale: float = 1.0, iterations: int | None = None,
                       syncs_per_worker_iter: float | None = None) -> tuple[float, float]:
        """(up, down) bytes per iteration at ``workers`` workers of ``env_scale`` times the run's envs each, in a run
        of ``iterations`` (None: steady state, the first copies left out), each worker syncing
        ``syncs_per_worker_iter`` times an iteration (None: as measured): the experience scales with the envs, the
        weights messages and the headers do not."""
        e = self.env_steps_per_worker_iter * env_scale
        first = self.first_copy_bytes / iterations if iterations else 0.0
        q = self.syncs_per_worker_iter if syncs_per_worker_iter is None else syncs_per_worker_iter
        return (workers * (e * self.up_bytes_per_step + self.up_bytes_per_worker_iter),
                workers * (e * self.down_bytes_per_step + self.down_bytes_per_worker_iter
                           + q * self.weight_bytes_per_sync + first))

    def sync_floor(self) -> float:
        """The fewest syncs per worker per iteration the rule allows (``1 / lag_bound``, at most the measured
        rate); 0 without a bound."""
        return min(self.syncs_per_worker_iter, 1.0 / self.lag_bound) if self.lag_bound else 0.0

    def pacing_s(self, pacing: Pacing | None, workers: int, env_scale: float, rtt_s: float) -> float:
        """What TCP's pacing adds to an iteration on a link of ``rtt_s``: a worker's reply at its size, and its
        request, with the weights inside where any of the ``workers`` syncs (the iteration waits for the slowest:
        with ``q`` syncs per worker, one of them syncs with probability 1 − (1 − q)^N)."""
        if pacing is None or not rtt_s:
            return 0.0
        reply = self.bytes_per_iter(1, env_scale)[0]
        request = self.bytes_per_iter(1, env_scale, syncs_per_worker_iter=0.0)[1]
        any_sync = 1.0 - (1.0 - min(1.0, self.syncs_per_worker_iter)) ** workers
        carrying = pacing.extra(request + self.weight_bytes_per_sync)
        return rtt_s * (pacing.extra(reply) + any_sync * carrying + (1.0 - any_sync) * pacing.extra(request))

    def rollout_compute_s(self, pacing: Pacing | None = None) -> float:
        """The measured rollout time less the measured run's own transfers over its link, their latency (paced by
        ``pacing``, if given) and its serving."""
        serve = self.serve_s_per_sample * self.workers * self.env_steps_per_worker_iter
        up, down = self.bytes_per_iter(self.workers, iterations=self.iterations or None)
        latency = self.rtt_s + self.pacing_s(pacing, self.workers, 1.0, self.rtt_s)
        transfer = 0.0 if self.link_gbit is None else (up + down) * 8 / (self.link_gbit * 1e9)
        return max(0.0, self.rollout_s_per_iter - serve - latency - transfer)


def _lag_bound(summary: dict[str, Any]) -> int | None:
    """The run's sync rule's lag bound: recorded with its syncs, or read from the rule's description in runs from
    before it was recorded (``every``: 1; ``aaps(δ, lag<=L)``: L)."""
    syncs = summary.get("weight_syncs", {})
    if "lag_bound" in syncs:
        return syncs["lag_bound"]
    rule = str(summary.get("details", {}).get("sync_rule", ""))
    found = re.search(r"lag<=(\d+)", rule)
    return 1 if rule == "every" else int(found.group(1)) if found else None


def contention(workers: int, worker_cores: int | None) -> float:
    """How much slower each worker steps when ``workers`` share ``worker_cores`` cores (None: a core each)."""
    return 1.0 if worker_cores is None else max(1.0, workers / worker_cores)


def predict(fig: RunFigures, workers: int, link_gbit: float | None, worker_cores: int | None = None,
            env_scale: float = 1.0, overlap: bool | None = None, iterations: int | None = None,
            rtt_s: float = 0.0, pacing: Pacing | None = None, step_cost: StepCost | None = None) -> dict[str, Any]:
    """Bytes and seconds per iteration at ``workers`` workers on a learner link of ``link_gbit`` (None: no limit)
    and ``rtt_s`` of round-trip time (its messages paced by ``pacing``, if given),
    each worker with ``env_scale`` times the measured run's envs (e.g. ½ for the same total envs on twice the
    workers): its env steps and experience bytes scale with it, its compute too (or as ``step_cost`` says); its
    weights messages do not. In a run of
    ``iterations`` (each worker's first full copy spread over them); None: steady state, a long run.

    ``overlap`` (default: the measured run's loop): the next rollout runs while the learner updates (IMPALA's
    rollout thread), so an iteration takes the longer of the rollout (transfers, the workers' stepping, its
    serving) and the learner core's work (serving and update share that core)."""
    overlap = fig.overlap if overlap is None else overlap
    up, down = fig.bytes_per_iter(workers, env_scale, iterations)
    # one round trip an iteration: every worker's rollout request (its weights inside) at once
    paced = fig.pacing_s(pacing, workers, env_scale, rtt_s)
    link_s = (0.0 if link_gbit is None else (up + down) * 8 / (link_gbit * 1e9)) + rtt_s + paced
    per_worker = (step_cost.factor(fig.envs_per_worker, fig.envs_per_worker * env_scale)
                  if step_cost is not None and fig.envs_per_worker else env_scale)
    compute = (fig.rollout_compute_s(pacing) * per_worker * contention(workers, worker_cores)
               / contention(fig.workers, worker_cores))
    samples = workers * fig.env_steps_per_worker_iter * env_scale
    update = fig.update_s_per_iter + fig.update_s_per_sample * samples
    serve = fig.serve_s_per_sample * samples
    s_per_iter = max(link_s + compute + serve, serve + update) if overlap else link_s + compute + serve + update
    down_floor = fig.bytes_per_iter(workers, env_scale, iterations, fig.sync_floor())[1]
    return {"workers": workers, "up_bytes_per_iter": up, "down_bytes_per_iter": down,
            "down_bytes_per_iter_floor": down_floor, "link_s": link_s, "latency_s": rtt_s + paced, "pacing_s": paced,
            "rollout_compute_s": compute, "serve_s": serve,
            "update_s": update, "s_per_iter": s_per_iter}


def saturation(fig: RunFigures, step_rate: float | None = None,
               links_gbit: tuple[float, ...] = LINKS_GBIT) -> dict[str, Any]:
    """Steady-state load per worker at ``step_rate`` env steps/s per worker (default: the measured run's own, its
    compute alone) and the worker counts at which the learner's link (each direction) and its core saturate."""
    e = fig.env_steps_per_worker_iter
    rate = step_rate or e / max(fig.rollout_compute_s(), 1e-9)
    up, down = fig.bytes_per_iter(1)
    per_step = {"up": up / e, "down": down / e}
    busiest = max(per_step.values())
    core = (fig.update_s_per_sample + fig.serve_s_per_sample) * rate
    headroom = max(0.0, 1.0 - fig.update_s_per_iter * rate / e)  # what the fixed part of each update leaves
    return {"step_rate_per_worker": rate, "bytes_per_env_step": per_step,
            "learner_core_share_per_worker": core, "learner_core_share_fixed": 1.0 - headroom,
            "workers_at_core_saturation": headroom / core if core else None,
            "workers_at_link_saturation": {f"{g:g}gbit": g * 1e9 / 8 / (rate * busiest) for g in links_gbit}}


def report(run_dir: str | Path, workers: list[int], link_gbit: float | None, run_link_gbit: float | None = None,
           worker_cores: int | None = None, step_rate: float | None = None,
           same_total_envs: bool = False, serve_us_per_step: float = 0.0,
           update_fit_run: str | Path | None = None, rtt_s: float = 0.0, run_rtt_s: float = 0.0,
           pacing: Pacing | None = None, step_cost: StepCost | None = None) -> dict[str, Any]:
    """The model's figures, predictions at ``workers`` and saturation counts, as ``frugalrl scale-model`` prints;
    ``same_total_envs`` spreads the run's envs over each worker count instead of giving each worker as many;
    ``update_fit_run``, a run of the same update at another batch size, splits off the update's fixed part;
    ``rtt_s`` and ``run_rtt_s``: the round trips of the predicted link and of the measured run's, their messages
    paced by ``pacing`` if given; ``step_cost``: a worker's step time by its envs (else proportional to them)."""
    fig = replace(RunFigures.from_run(run_dir, run_link_gbit), serve_s_per_sample=serve_us_per_step * 1e-6,
                  rtt_s=run_rtt_s)
    if update_fit_run is not None:
        fig = fig.with_update_fit(RunFigures.from_run(update_fit_run))
    return {"figures": asdict(fig), "link_gbit": link_gbit, "worker_cores": worker_cores,
            "same_total_envs": same_total_envs,
            "rtt_s": rtt_s, "pacing": None if pacing is None else asdict(pacing),
            "step_cost": None if step_cost is None else asdict(step_cost),
            "predictions": [predict(fig, n, link_gbit, worker_cores, fig.workers / n if same_total_envs else 1.0,
                                    rtt_s=rtt_s, pacing=pacing, step_cost=step_cost) for n in workers],
            "saturation": saturation(fig, step_rate)}
