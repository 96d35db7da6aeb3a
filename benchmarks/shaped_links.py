"""PPO over a Ray cluster whose learner link is rate-shaped: wall time per iteration and bytes by kind.

Network namespaces (:class:`frugalrl.netem.TestHosts`): host 0 runs the Ray head with 0 CPUs and the PPO driver
(``frugalrl train ppo --backend ray``), each of ``--hosts`` more hosts (default 1) a Ray worker node; the env
workers fill them. For each link rate (``tbf`` on every host's egress, so host 0's is the learner's link), each
one-way delay (``--delays``: netem's, or where the kernel has none a TUN link's forwarder, :mod:`frugalrl.tunlink`)
and each sync setting (``every``: fp32 weights after every update; ``aaps``: AAPS
δ, fp32; ``aaps-bf16``: AAPS, bf16), one short run; wall time per PPO iteration is the ``time``
column of the run's ``metrics.jsonl`` (last row / number of updates, and the median step between
rows), bytes by kind come from ``summary.json``. Needs root, ``ip``/``tc`` and ray. Example::

    python benchmarks/shaped_links.py --env LunarLander-v3 --total-timesteps 16384
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import ray
import torch
from _commit import measured_commit

from frugalrl import netem
from frugalrl.ray_hosts import RayCluster

if TYPE_CHECKING:
    from frugalrl.scale_model import Pacing, StepCost

#: Sync setting → its flags (weights delta-coded, the default, in all).
SYNCS = {"every": ["--sync", "every", "--weights-codec", "fp32"], "aaps": ["--sync", "aaps", "--weights-codec", "fp32"],
         "aaps-bf16": ["--sync", "aaps", "--weights-codec", "bf16"]}
KINDS = ("observations", "actions", "rewards", "behaviour", "weights", "info", "control")


def _rate_bps(rate: str) -> float:
    """``"10mbit"`` → 1e7 (tc's units)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    return float(rate)


def uplink_savings(rows: list[dict]) -> list[dict]:
    """For each (rate, sync) run with ``--uplink none`` and a compressing uplink: the link time the raw run's
    bytes take per iteration, the share of it the byte ratio should save, and the iteration time it did save."""
    out = []
    raw = {_key(r)[:3]: r for r in rows if r["uplink"] == "none"}
    for r in rows:
        base = raw.get(_key(r)[:3])
        if base is None or r is base:
            continue
        link_s = base["bytes"]["total"] * 8 / _rate_bps(r["rate"]) / base["updates"]
        expected = link_s * (1 - r["bytes"]["total"] / base["bytes"]["total"])
        saved = base["s_per_iter"] - r["s_per_iter"]
        out.append({"rate": r["rate"], "sync": r["sync"], "uplink": r["uplink"],
                    "byte_ratio": r["bytes"]["total"] / base["bytes"]["total"],
                    "raw_link_ms_per_iter": link_s * 1e3, "expected_saving_ms": expected * 1e3,
                    "measured_saving_ms": saved * 1e3, "met": saved >= expected})
    return out


def _key(r: dict) -> tuple:
    """What a run's setting is, besides its worker count (runs before ``--delays`` had no delay)."""
    return r["rate"], r.get("delay", "0"), r["sync"], r["uplink"]


def model_check(rows: list[dict], base_delay: str | None = None, pacing: Pacing | None = None,
                step_cost: StepCost | None = None) -> list[dict]:
    """frugalrl.scale_model's predictions for every run from the smallest worker count's run of the same link,
    sync and uplink (its bytes, its rollout time less its transfers and latency, its update time per sample) and,
    with ``base_delay``, of that delay (the model then adds the other delays' round trips), against what each run
    measured: bytes per iteration each way and the median seconds per iteration. ``pacing``: a
    :class:`frugalrl.scale_model.Pacing` for the round trips (None: one round trip an iteration); ``step_cost``: a
    :class:`frugalrl.scale_model.StepCost` (None: a worker's compute proportional to its envs)."""
    from frugalrl.scale_model import RunFigures, predict

    def setting(r: dict) -> tuple:  # a delay by its seconds: "0", "0ms" and "0s" are one
        rate, delay, sync, uplink = _key(r)
        return rate, netem.parse_delay(delay), sync, uplink

    settings = [setting(q) for q in rows]
    if base_delay is not None and not any(netem.parse_delay(r.get("delay", "0")) == netem.parse_delay(base_delay)
                                          for r in rows):
        raise ValueError(f"no run has the delay to model from ({base_delay!r}); the runs' delays: "
                         f"{sorted({r.get('delay', '0') for r in rows})}")
    out = []
    for r in rows:
        rate, delay, sync, uplink = _key(r)
        base_s = netem.parse_delay(delay if base_delay is None else base_delay)
        same = [q for q, at in zip(rows, settings, strict=True) if at == (rate, base_s, sync, uplink)]
        if not same:  # e.g. a rate or sync run only at other delays
            continue
        base = min(same, key=lambda q: q["workers"])
        link = None if r["rate"] == "unshaped" else _rate_bps(r["rate"]) / 1e9
        fig = RunFigures.from_summary(base["summary"], link, rtt_s=base.get("rtt_s", 0.0))
        scale = r["summary"]["details"]["envs_per_worker"] / base["summary"]["details"]["envs_per_worker"]
        p = predict(fig, r["workers"], link, worker_cores=os.cpu_count(), env_scale=scale,
                    iterations=r["updates"], rtt_s=r.get("rtt_s", 0.0), pacing=pacing, step_cost=step_cost)
        measured = {"s_per_iter": r["s_per_iter_median"], "up_bytes_per_iter": r["up_bytes_per_iter"],
                    "down_bytes_per_iter": r["down_bytes_per_iter"]}
        out.append({"rate": r["rate"], "delay": delay, "sync": r["sync"], "uplink": r["uplink"],
                    "workers": r["workers"], "from_delay": _key(base)[1],
                    "from_workers": base["workers"], "predicted": p, "measured": measured,
                    "error": {k: p[k] / v - 1 if v else None for k, v in measured.items()}})
    return out


def plot_model(model: list[dict], path: Path) -> None:
    """Seconds and MB per iteration against workers, per link and sync rule: measured (points), predicted (lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for i, key in enumerate(sorted({_key(m) for m in model})):
        rows = sorted((m for m in model if _key(m) == key), key=lambda m: m["workers"])
        w = [m["workers"] for m in rows]
        color = f"C{i}"
        for ax, get in ((axes[0], lambda d: d["s_per_iter"]),
                        (axes[1], lambda d: (d["up_bytes_per_iter"] + d["down_bytes_per_iter"]) / 1e6)):
            name = f"{key[0]} {key[2]}" if key[1] == "0" else f"{key[0]} {key[1]} {key[2]}"
            ax.plot(w, [get(m["predicted"]) for m in rows], "-", color=color, label=f"{name} (model)")
            ax.plot(w, [get(m["measured"]) for m in rows], "o", color=color, label=f"{name} (measured)")
    for ax, label in zip(axes, ("seconds per iteration", "MB per iteration (both directions)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def remodel(path: Path, pacing: str | None = None, step_cost: str | None = None) -> None:
    """Replace a results file's ``model`` with this commit's predictions from the same measured runs (the runs stay
    as measured; ``model_from`` records the recomputation); with ``pacing`` (``link_rtt.py``'s JSON[:TRANSPORT])
    and/or ``step_cost`` (``worker_step_cost.py``'s JSON), write them as ``model_paced``, ``model_stepcost`` or
    ``model_paced_stepcost`` beside the model, which stays as it is."""
    from frugalrl.scale_model import Pacing, StepCost

    out = json.loads(path.read_text())
    paced = None if pacing is None else Pacing.parse(pacing)
    cost = None if step_cost is None else StepCost.from_json(step_cost)
    key = "model" + ("_paced" if paced else "") + ("_stepcost" if cost else "")
    out[key] = model_check(out["runs"], out["config"].get("model_from_delay"), paced, cost)
    out[f"{key}_from"] = {"command": " ".join(shlex.quote(a) for a in sys.argv), "commit": measured_commit(),
                          "date": time.strftime("%Y-%m-%d")}
    if len({r["workers"] for r in out["runs"]}) > 1 and key == "model":
        plot_model(out["model"], path.with_suffix(".png"))
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"rewrote the {key} of {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="LunarLander-v3")
    parser.add_argument("--rates", default="1gbit,100mbit,10mbit")
    parser.add_argument("--delays", default="0",
                        help="one-way delays on every host's egress, e.g. 0,10ms (netem, or a TUN link without it)")
    parser.add_argument("--slow-start-after-idle", type=int, choices=(0, 1), default=None,
                        help="set every host's net.ipv4.tcp_slow_start_after_idle (default: the kernel's, 1 on Linux)")
    parser.add_argument("--ingress", action="store_true",
                        help="also limit what reaches each host to the rate (the switch port toward it): the "
                             "workers' uplinks then share the learner's link, as at a real NIC")
    parser.add_argument("--model-from-delay", default=None, metavar="DELAY",
                        help="model every delay from the runs at this one (default: each from its own)")
    parser.add_argument("--syncs", default="every,aaps")
    parser.add_argument("--uplinks", default="auto",
                        help="--uplink options to run (e.g. none,auto); 'none' also sends full behaviour parameters "
                             "(raw fp32 experience, as before the uplink codecs)")
    parser.add_argument("--kl-threshold", type=float, default=0.05)
    parser.add_argument("--workers", type=int, nargs="+", default=[2],
                        help="worker counts; with several, each run's bytes and time per iteration are also predicted "
                             "by frugalrl.scale_model from the smallest count's run of the same link and sync")
    parser.add_argument("--total-envs", type=int, default=None,
                        help="the same envs for every worker count, spread over its workers (default: "
                             "--envs-per-worker each)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="PPO iterations per run (default: --total-timesteps at the smallest worker count)")
    parser.add_argument("--hosts", type=int, default=1,
                        help="emulated worker hosts, each a Ray node in its own network namespace behind the "
                             "learner's shaped link; the workers are spread over them")
    parser.add_argument("--envs-per-worker", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--total-timesteps", type=int, default=16384)
    parser.add_argument("--eval-episodes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per run")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "shaped_links.json"))
    parser.add_argument("--remodel", metavar="JSON",
                        help="run nothing: recompute the model's predictions (and plot) of a results file from the "
                             "runs it stored, with this commit's frugalrl.scale_model")
    parser.add_argument("--pacing", metavar="JSON[:TRANSPORT]",
                        help="with --remodel: the predictions with TCP's pacing (link_rtt.py's measurement, "
                             "transport tcp-bbr by default), written as model_paced")
    parser.add_argument("--step-cost", metavar="JSON",
                        help="with --remodel: the predictions with a worker's step cost by its envs "
                             "(worker_step_cost.py's measurement), written as model_stepcost (or _paced_stepcost)")
    args = parser.parse_args()
    if args.remodel:
        remodel(Path(args.remodel), args.pacing, args.step_cost)
        return
    if args.pacing or args.step_cost:
        sys.exit("--pacing and --step-cost go with --remodel")
    unknown = set(args.syncs.split(",")) - set(SYNCS)
    if unknown:
        sys.exit(f"unknown --syncs {sorted(unknown)}; expected some of {list(SYNCS)}")
    ok, why = netem.netns_available()
    if not ok:
        sys.exit(f"network namespaces unavailable: {why}")

    rows = []
    t_start = time.monotonic()
    if args.hosts < 1 or max(args.workers) < args.hosts:
        sys.exit(f"--hosts must be in [1, the largest worker count], got {args.hosts}")
    per_host = -(-max(args.workers) // args.hosts)  # CPUs per worker node: the most workers fill every host
    delays = args.delays.split(",")
    delayed = any(netem.parse_delay(d) > 0 for d in delays)
    if args.model_from_delay is not None and netem.parse_delay(args.model_from_delay) not in map(netem.parse_delay, delays):
        sys.exit(f"--model-from-delay {args.model_from_delay} is not one of --delays {args.delays}")
    link = netem.default_link(delayed)
    with tempfile.TemporaryDirectory(prefix="frl-shaped-") as run_dir, \
            netem.TestHosts(n=args.hosts + 1, link=link) as hosts, RayCluster(hosts, worker_cpus=per_host) as cluster:
        if args.slow_start_after_idle is not None:  # each namespace has its own TCP settings
            for i in range(hosts.n):
                hosts.run(i, ["sysctl", "-qw", f"net.ipv4.tcp_slow_start_after_idle={args.slow_start_after_idle}"],
                          check=True, timeout=10)
        for rate, delay in [(r, d) for r in args.rates.split(",") for d in delays]:
            one_way = netem.parse_delay(delay)
            hosts.shape(rate=rate, delay=delay, ingress=args.ingress)
            for sync, uplink, workers in [(s, u, w) for s in args.syncs.split(",") for u in args.uplinks.split(",")
                                          for w in sorted(args.workers)]:
                name = f"{rate}-{sync}-{uplink}-w{workers}" + (f"-d{delay}" if one_way > 0 else "")
                k = args.total_envs // workers if args.total_envs else args.envs_per_worker
                batch = workers * k * args.num_steps
                total = args.iterations * batch if args.iterations else args.total_timesteps
                argv = [sys.executable, "-m", "frugalrl.cli", "train", "ppo", "--env", args.env,
                        "--backend", "ray", "--ray-address", cluster.address,
                        "--workers", str(workers), "--envs-per-worker", str(k),
                        "--num-steps", str(args.num_steps), "--total-timesteps", str(total),
                        "--eval-every", "1000000",
                        *SYNCS[sync], "--uplink", uplink,
                        *(["--uplink-behaviour", "params"] if uplink == "none" else []), "--kl-threshold", str(args.kl_threshold), "--seed", str(args.seed),
                        "--eval-episodes", str(args.eval_episodes), "--progress", "false",
                        # the LunarLander settings of benchmarks/_ppo_runs.py
                        "--num-minibatches", "32", "--learning-rate", "5e-4", "--gamma", "0.999",
                        "--gae-lambda", "0.98",
                        "--tensorboard", "false", "--log-every-s", "0", "--plots", "false", "--run-dir", run_dir, "--run-name", name]
                t0 = time.monotonic()
                proc = hosts.run(0, argv, capture_output=True, text=True, timeout=args.timeout, env=cluster.env)
                if proc.returncode != 0:
                    raise RuntimeError(f"run {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                d = Path(run_dir) / name
                summary = json.loads((d / "summary.json").read_text())
                metrics = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines() if ln.strip()]
                times = [m["time"] for m in metrics if "losses/policy" in m]
                steps = [b - a for a, b in zip(times, times[1:], strict=False)]
                rows.append({
                    "rate": rate, "delay": delay, "rtt_s": 2 * one_way, "link": link,
                    "sync": sync, "uplink": uplink, "workers": workers, "hosts": args.hosts,
                    "updates": summary["updates"],
                    "env_steps": summary["env_steps"],
                    "up_bytes_per_iter": sum(summary["bytes"]["up"].values()) / summary["updates"],
                    "down_bytes_per_iter": sum(summary["bytes"]["down"].values()) / summary["updates"],
                    "summary": {k: summary[k] for k in ("algo", "env_steps", "updates", "weight_syncs", "bytes",
                                                        "details", "resumes")},
                    "s_per_iter": times[-1] / len(times),
                    "s_per_iter_median": statistics.median(steps) if steps else times[-1],
                    "train_wall_s": summary["wall_seconds"], "run_wall_s": time.monotonic() - t0,
                    "weight_syncs": summary["weight_syncs"]["total"],
                    "bytes": {k: summary["bytes"][k] for k in (*KINDS, "total", "up", "down")},
                    "eval_return_mean": summary["eval_return_mean"],
                    "command": " ".join(shlex.quote(a) for a in [*hosts.exec_prefix(0), *argv]),
                })
                r = rows[-1]
                print(f"{name}: {r['s_per_iter'] * 1e3:.0f} ms/iter, {r['bytes']['total'] / 1e6:.2f} MB, "
                      f"{r['weight_syncs']} syncs", flush=True)
        hosts.shape()

    print()
    print("| link | delay | sync | uplink | updates | ms / iteration (mean) | ms / iteration (median) | syncs | "
          + " | ".join(f"{k} MB" for k in ("observations", "behaviour", "weights", "total")) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mb = " | ".join(f"{r['bytes'][k] / 1e6:.2f}" for k in ("observations", "behaviour", "weights", "total"))
        print(f"| {r['rate']} | {r['delay']} | {r['sync']} | {r['uplink']} | {r['updates']} | {r['s_per_iter'] * 1e3:.0f} | "
              f"{r['s_per_iter_median'] * 1e3:.0f} | {r['weight_syncs']} | {mb} |")
    out: dict = {
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "config": vars(args),
        "cluster": f"Ray head (0 CPUs) + driver in netns host 0, a Ray worker node ({per_host} CPUs) in each of "
                   f"{args.hosts} more netns hosts; tbf rate on every host's egress"
                   + ("; the same rate on the switch port toward every host (ingress)" if args.ingress else "")
                   + (f"; hosts joined by {link} devices" + (" and frugalrl.tunlink's forwarder (the delay)"
                                                              if link == "tun" else "")),
        "commit": measured_commit(),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "ray": ray.__version__},
        "total_seconds": time.monotonic() - t_start,
        "runs": rows,
        "uplink_savings": uplink_savings(rows),
        "model": model_check(rows, args.model_from_delay),
    }
    if len(args.workers) > 1:
        plot_model(out["model"], Path(args.out).with_suffix(".png"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {args.out} ({out['total_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
