"""How many workers one learner can serve: the head's cost per ingested env step against the number of workers.

Workers are emulated by the ``replay`` backend (:mod:`frugalrl.envs.backends.replay`): one real LunarLander worker
records a few rollout fragments with the real uplink codecs, then 1 … 256 emulated workers answer with them, so
that only the head's own work is timed: encoding requests and weights (full copies or deltas), decoding and
metering replies, AAPS's KL on each worker's states, keeping those states, recomputing the behaviour's
log-probabilities from the words each worker holds (the default), assembling the batch. Between two
rollouts the learner runs a real PPO update (LunarLander's preset), or IMPALA's (V-trace, then its clipped epochs;
settings ``impala-*``), on the replayed batch, so weights change as in training; its time is reported but is not
serving. ``impala-overlap-*`` runs IMPALA's loop as training does: the next rollout, on a thread, while the learner
updates (the actors a copy of the learner, refreshed between rollouts); the first iteration of every setting is
not counted, nor are its bytes. Each (sync setting, worker count) runs in a fresh interpreter
(its memory per worker is the growth of its resident memory over one worker's).

For scale, it also times a real worker's rollout per env step (8 LunarLander envs, its numpy policy), and turns
the measured bytes and times into a first-order model: the learner's link and CPU load at N workers, and the
worker count at which each saturates for links of 1, 10, 25 and 100 Gbit/s.

``--pace`` checks :mod:`frugalrl.scale_model` against the head at many workers: the emulated workers then step at
a real worker's rate (``--pace worker``, the rate measured here) or a given one (env steps/s each, on cores of
their own), each setting is first measured unpaced at two worker counts (``--calibrate``), and the model's seconds per
iteration (rollout + update) from those runs are set against those measured at every worker count (see
:func:`model_check`). ``--backend local --pace worker`` checks the same model, still fitted on emulated workers,
against real worker processes (on a machine with a core for each). Example::

    python benchmarks/learner_capacity.py                      # → benchmarks/results/learner_capacity.json
    python benchmarks/learner_capacity.py --workers 1 8 64 --settings every-fp32 aaps-bf16
    python benchmarks/learner_capacity.py --pace worker --workers 4 16 64 256 --out learner_capacity_paced
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _commit import measured_commit

RESULTS = Path(__file__).parent / "results"
ENV, K, T = "LunarLander-v3", 8, 64
SETTINGS = {  # sync rule, weights codec, delta-coded syncs, the learner's update, the next rollout during it
    "every-fp32": ("every", "fp32", False, "ppo", False),
    "aaps-fp32": ("aaps", "fp32", False, "ppo", False),
    "aaps-bf16": ("aaps", "bf16", False, "ppo", False),
    "aaps-bf16-delta": ("aaps", "bf16", True, "ppo", False),
    "impala-every-fp32": ("every", "fp32", False, "impala", False),
    "impala-aaps-bf16-delta": ("aaps", "bf16", True, "impala", False),
    "impala-overlap-aaps-bf16-delta": ("aaps", "bf16", True, "impala", True),
}
LINKS_GBIT = (1, 10, 25, 100)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one(setting: str, workers: int, updates: int, backend: str = "replay",
        steps_per_second: float | None = None) -> dict[str, Any]:
    """The head's time by phase over ``updates`` rollouts + PPO updates with ``workers`` emulated workers (or real
    ones: ``backend="local"``, to check the replayed bytes against a real run's), stepping ``steps_per_second``
    env steps per second each (None: answering at once)."""
    import torch

    import frugalrl.envs.cluster as cluster_module
    from frugalrl import AAPS, ClusterEnv, EveryUpdate, make_agent
    from frugalrl.algos.impala import impala_update
    from frugalrl.algos.ppo import ppo_update
    from frugalrl.correct import parse_correctors
    from frugalrl.envs.backends.replay import ReplayBackend
    from frugalrl.presets import make_config
    from frugalrl.rollout import RolloutsAhead
    from frugalrl.sync_state import PolicySync

    torch.set_num_threads(1)
    rule, codec, delta, algo, overlap = SETTINGS[setting]
    base_rss = _rss_mb()
    env = ClusterEnv(ENV, num_workers=workers, envs_per_worker=K, backend=backend, seed=0, weights_codec=codec,
                     weights_delta=delta, sync=AAPS(0.05) if rule == "aaps" else EveryUpdate())
    cfg = make_config(algo, ENV, seed=0)
    torch.manual_seed(0)
    agent = make_agent(env.single_observation_space, env.single_action_space)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)
    generator = torch.Generator().manual_seed(0)
    if algo == "impala":  # V-trace, then the clipped epochs
        correctors = parse_correctors(cfg.correct)

        def learn(batch: Any) -> None:
            impala_update(agent, optimizer, batch, correctors, cfg, generator)
    else:

        def learn(batch: Any) -> None:
            ppo_update(agent, optimizer, batch, cfg, generator)
    spent: dict[str, float] = {}

    def timed(owner: Any, name: str, phase: str, only: str | None = None) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if only is not None and not any(getattr(m, "op", None) == only for m in args[-1].values()):
                return inner(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + time.perf_counter() - t0

        setattr(owner, name, wrapper)

    timed(PolicySync, "select", "kl")
    timed(PolicySync, "behaviour_logp", "recompute")
    timed(PolicySync, "push", "weights")
    timed(ReplayBackend, "request", "rollout_io", only="rollout")
    timed(cluster_module.ClusterEnv, "_remember", "remember")
    timed(cluster_module, "assemble_rollout", "assemble")
    # Overlapped, the workers act with a copy that follows the learner between rollouts, as IMPALA's actors do.
    actor = copy.deepcopy(agent) if overlap else agent
    env.rollout(actor, T)  # the recordings, the first sync
    if steps_per_second is not None:
        env.backend.pace(steps_per_second)
    spent.clear()
    steps, serve, update, wait = 0, 0.0, 0.0, 0.0

    def rollout() -> tuple[Any, float, dict[str, dict[str, int]]]:
        """A rollout, its wall time and the bytes it moved by direction and kind (its weights sync included)."""
        before = env.meter.by_direction()
        t0 = time.perf_counter()
        batch = env.rollout(actor, T)
        seconds = time.perf_counter() - t0
        after = env.meter.by_direction()
        return batch, seconds, {d: {k: n - before[d].get(k, 0) for k, n in kinds.items()} for d, kinds in after.items()}

    rollouts = RolloutsAhead(rollout, overlap)  # overlapped: IMPALA's loop, the next rollout during the update
    rollouts.start()
    start = time.perf_counter()
    moved: dict[str, Counter[str]] = {"up": Counter(), "down": Counter()}  # by the counted rollouts
    for i in range(updates + 1):  # the first iteration is not counted: overlapped, nothing hid its rollout
        if i == 1:
            start = time.perf_counter()
            spent.clear()
            steps, serve, update, wait = 0, 0.0, 0.0, 0.0
        t0 = time.perf_counter()
        batch, seconds, traffic = rollouts.take()
        if i >= 1:
            for d, kinds in traffic.items():
                moved[d].update(kinds)
        wait += time.perf_counter() - t0
        if overlap:  # the actors take the learner's weights, the next rollout starts
            actor.load_state_dict(agent.state_dict())
            rollouts.start()
        t1 = time.perf_counter()
        learn(batch)
        serve += seconds
        update += time.perf_counter() - t1
        steps += batch.num_steps * batch.num_envs
    elapsed = time.perf_counter() - start
    rollouts.close()  # the rollout still in flight is not counted
    stats = env.stats()
    out = {
        "setting": setting, "workers": workers, "env_steps": steps, "overlap": overlap,
        "steps_per_second": steps_per_second, "s_per_iter": elapsed / updates,
        # a rollout's wall time per env step (its serving, and with paced workers their stepping); overlapped, the
        # learner waited for rollouts only ``wait_us_per_step`` of it
        "serve_us_per_step": serve / steps * 1e6, "update_us_per_step": update / steps * 1e6,
        "wait_us_per_step": wait / steps * 1e6,
        "phases_us_per_step": {k: v / steps * 1e6 for k, v in sorted(spent.items())},
        "bytes": {"up": dict(moved["up"]), "down": dict(moved["down"]),
                  "total": moved["up"].total() + moved["down"].total()},
        "weight_syncs": stats["weight_syncs"]["total"], "rss_mb": _rss_mb() - base_rss,
    }
    env.close()
    return out


def worker_cost(rollouts: int = 6) -> float:
    """A real worker's time per env step: a rollout of ``K`` LunarLander envs × ``T`` steps with its numpy policy."""
    import torch

    from frugalrl import ClusterEnv, make_agent

    torch.set_num_threads(1)
    env = ClusterEnv(ENV, num_workers=1, envs_per_worker=K, backend="serial", seed=0)
    agent = make_agent(env.single_observation_space, env.single_action_space)
    env.rollout(agent, T)
    worker = env.backend.workers[0]
    from frugalrl.wire.message import Message

    times = []
    for _ in range(rollouts):
        t0 = time.perf_counter()
        worker.handle(Message("rollout", {"num_steps": T}))
        times.append(time.perf_counter() - t0)
    env.close()
    return statistics.median(times) / (K * T) * 1e6


def model(row: dict[str, Any], worker_us: float) -> dict[str, Any]:
    """First-order load at N workers from one measured row: each worker steps 1e6 / worker_us env steps per second;
    the learner's link carries the measured bytes per env step, its core the measured serving µs per env step."""
    rate = 1e6 / worker_us  # env steps per second per worker
    per_step = {d: sum(row["bytes"][d].values()) / row["env_steps"] for d in ("up", "down")}
    busiest = max(per_step.values())
    return {
        "bytes_per_env_step": per_step,
        "workers_per_learner_core": 1e6 / (rate * row["serve_us_per_step"]),
        "workers_at_link_saturation": {f"{g}gbit": g * 1e9 / 8 / (rate * busiest) for g in LINKS_GBIT},
    }


def _figures(row: dict[str, Any], rate: float, serve: bool) -> Any:
    """The figures a real run at ``row``'s worker count would give (its rollout: the workers' stepping at
    ``rate``, then the head's serving), the serving term in the model or left out."""
    from frugalrl.scale_model import RunFigures

    e, samples, down = K * T, row["env_steps"], row["bytes"]["down"]
    serve_s = row["serve_us_per_step"] * 1e-6
    return RunFigures(workers=row["workers"], env_steps_per_worker_iter=e,
                      up_bytes_per_step=sum(row["bytes"]["up"].values()) / samples,
                      down_bytes_per_step=(sum(down.values()) - down.get("weights", 0)) / samples,
                      weight_bytes_per_sync=0.0, syncs_per_worker_iter=0.0,
                      rollout_s_per_iter=e / rate + serve_s * row["workers"] * e,
                      update_s_per_sample=row["update_us_per_step"] * 1e-6, link_gbit=None,
                      serve_s_per_sample=serve_s if serve else 0.0)


def sequential_twin(setting: str) -> str:
    """The setting that differs from ``setting`` only in running its rollouts after the update: what an overlapped
    setting's model is fitted on (its phases do not share the learner's core)."""
    *same, overlap = SETTINGS[setting]
    if not overlap:
        return setting
    return next(name for name, values in SETTINGS.items() if list(values) == [*same, False])


def model_check(calibration: list[dict[str, Any]], paced: dict[str, Any], rate: float,
                overlap: bool = False) -> dict[str, Any]:
    """:func:`frugalrl.scale_model.predict` from two unpaced rows (``--calibrate``), against a paced row's seconds
    per iteration: the model with its serving term and the update fitted on both rows; with the
    update linear in the batch (one run, as ``frugalrl scale-model`` without ``--update-fit-run``); and as it was
    before either (no serving term, linear update)."""
    from frugalrl.scale_model import predict

    first, second = calibration
    updates = paced["env_steps"] / (paced["workers"] * K * T)
    update_s = paced["update_us_per_step"] * 1e-6 * paced["env_steps"] / updates
    out: dict[str, Any] = {"calibration_workers": [first["workers"], second["workers"]],
                           "measured_s_per_iter": paced["s_per_iter"], "measured_update_s_per_iter": update_s,
                           "measured_up_bytes_per_iter": sum(paced["bytes"]["up"].values()) / updates}
    for key, fig in (("model", _figures(first, rate, True).with_update_fit(_figures(second, rate, True))),
                     ("model_linear_update", _figures(first, rate, True)),
                     ("model_before", _figures(first, rate, False))):
        p = predict(fig, paced["workers"], None, overlap=overlap)
        out[key] = {"s_per_iter": p["s_per_iter"], "update_s": p["update_s"], "serve_s": p["serve_s"],
                    "error": p["s_per_iter"] / paced["s_per_iter"] - 1,
                    "up_bytes_error": p["up_bytes_per_iter"] / out["measured_up_bytes_per_iter"] - 1}
        if not overlap:  # an iteration is its rollout, then its update: each part's error on its own
            out[key]["rollout_error"] = ((p["s_per_iter"] - p["update_s"]) / (paced["s_per_iter"] - update_s) - 1)
            out[key]["update_error"] = p["update_s"] / update_s - 1
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--settings", nargs="+", default=None, choices=list(SETTINGS),
                    help="default: all, but unpaced only the sequential ones (an overlapped rollout's wall time "
                         "includes the update that holds the interpreter meanwhile: it is not serving)")
    ap.add_argument("--updates", type=int, default=4, help="measured rollouts + updates per run")
    ap.add_argument("--one", nargs=2, metavar=("SETTING", "WORKERS"), help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="replay", choices=["replay", "local"],
                    help="local: real worker processes (on a small machine, few), to check the replayed bytes")
    ap.add_argument("--pace", default=None, metavar="RATE|worker",
                    help="emulated workers step at this many env steps/s each ('worker': a real worker's rate), and "
                         "the scale model is checked against them (default: unpaced, they answer at once); with "
                         "--backend local only 'worker': the model is checked against real worker processes")
    ap.add_argument("--calibrate", nargs=2, type=int, default=[4, 16], metavar=("W1", "W2"),
                    help="with --pace: the two unpaced worker counts the model is fitted on (default: 4 16)")
    ap.add_argument("--out", default="learner_capacity")
    args = ap.parse_args(argv)
    if args.one:
        rate = None if args.pace is None else float(args.pace)
        print(json.dumps(one(args.one[0], int(args.one[1]), args.updates, args.backend, rate)))
        return {}
    if args.pace is not None and args.backend != "replay" and args.pace != "worker":
        ap.error("--pace RATE needs the replay backend (real workers step at their own rate: --pace worker)")
    if args.settings is None:
        args.settings = [name for name, values in SETTINGS.items() if args.pace is not None or not values[-1]]
    t0 = time.time()
    start_load = os.getloadavg()
    worker_us = worker_cost()
    print(f"a real worker: {worker_us:.1f} µs per env step ({K} {ENV} envs, numpy policy)", flush=True)
    pace = None if args.pace is None else 1e6 / worker_us if args.pace == "worker" else float(args.pace)

    def run(setting: str, w: int, rate: float | None, backend: str = args.backend) -> dict[str, Any]:
        """One setting at ``w`` workers in a fresh interpreter; real workers (local) are never paced."""
        paced = rate is not None and backend == "replay"
        cmd = [sys.executable, __file__, "--one", setting, str(w), "--updates", str(args.updates),
               "--backend", backend, *(["--pace", repr(rate)] if paced else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    rows, calibrations = [], {}
    for setting in args.settings:
        # the model is fitted on unpaced emulated workers, whichever backend it is then checked against
        calibration = None if pace is None else [run(sequential_twin(setting), w, None, "replay")
                                                 for w in args.calibrate]
        if calibration is not None:
            calibrations[setting] = calibration
        for w in args.workers:
            row = run(setting, w, pace)
            row["model"] = model(row, worker_us)
            row["serve_vs_worker"] = row["serve_us_per_step"] / worker_us
            if calibration is not None:
                row["model_check"] = model_check(calibration, row, pace, row["overlap"])
            rows.append(row)
            check = "" if calibration is None else (
                f" s/iter {row['s_per_iter']:.3f} model {row['model_check']['model']['error']:+.1%} "
                f"(linear update {row['model_check']['model_linear_update']['error']:+.1%}, "
                f"before {row['model_check']['model_before']['error']:+.1%}) "
                f"up bytes {row['model_check']['model']['up_bytes_error']:+.1%}")
            print(f"{setting:16s} W={w:4d} serve {row['serve_us_per_step']:6.2f} µs/step "
                  f"({row['serve_vs_worker']:.3f} of a worker's) update {row['update_us_per_step']:6.1f} µs/step "
                  f"syncs {row['weight_syncs']:5d} down {row['model']['bytes_per_env_step']['down']:7.1f} B/step "
                  f"rss {row['rss_mb']:6.1f} MB{check}", flush=True)
    commit = measured_commit()
    out = {"command": "python benchmarks/learner_capacity.py " + " ".join(argv or sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit, "torch_threads": 1,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_start": start_load,
                       "load_avg_end": os.getloadavg()},
           "backend": args.backend, "pace_steps_per_second": pace, "env": ENV, "envs_per_worker": K, "num_steps": T, "worker_us_per_env_step": worker_us, "rows": rows,
           **({"calibration": calibrations} if calibrations else {}),
           "seconds": round(time.time() - t0, 1)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
