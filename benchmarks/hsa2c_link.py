"""HSA2C against DDRL A3C across a real network link: the parameter server on one host, the workers on another.

    python benchmarks/hsa2c_link.py --rates unshaped 100mbit            # 5 seeds each, LunarLander-v3
    python benchmarks/hsa2c_link.py --rates 100mbit --seeds 1 --budget-scale 0.2 --out x   # a smoke run

:mod:`hsa2c_vs_sync` runs both variants on one machine, where a message is a Unix-socket write: nothing
there makes a message cost what it costs in the DPSGD paper's cluster, so A3C's one exchange per gradient
is nearly free. Here the same comparison runs over the Ray transport of DPSGD (``transport="ray"``)
between two network namespaces (:class:`frugalrl.netem.TestHosts`): host 0 holds the Ray head (0 CPUs)
and the driver with the parameter server (the paper's master), host 1 a Ray worker node that gets both
workers. Every pull and push is a Ray call over TCP through the veth link, and for each ``--rates`` entry
the link is shaped with ``tbf`` on both hosts' egress (``unshaped``: the bare veth pair; this kernel has
no netem, so there is no added delay). Both hosts share this machine's CPUs, so the link, the per-message
cost of Ray and the CPU the Ray daemons take are what differ from :mod:`hsa2c_vs_sync`'s local runs.

For each rate it runs ``hsa2c_vs_sync.py --envs LunarLander-v3 --variants hsa2c a3c`` inside host 0
(same settings, steps, cadence and deferred evaluation; output ``<out>_<rate>.json`` / ``.md``), then
writes ``<out>.json`` / ``.md`` with each rate's time and bytes to every reference return, the ratio
A3C / HSA2C of the mean times (> 1: HSA2C is faster), and how many seeds hold what they learned (final policy
≥ 0.9 × the best-checked one, both scored again on the same fresh episodes; see ``hsa2c_vs_sync``). Needs root,
``ip``/``tc`` and ray.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import ray
from dpsgd_speedup import RESULTS

from frugalrl import netem
from frugalrl.ray_hosts import RayCluster

HERE = Path(__file__).resolve().parent
ENV = "LunarLander-v3"


def rate_rows(out: str, rate: str) -> list[dict]:
    """The table rows of one rate's ``hsa2c_vs_sync`` run, trimmed to what the summary needs."""
    d = json.loads((RESULTS / f"{out}.json").read_text())
    keep = ("variant", "target", "time_to_target", "times", "env_steps_per_s", "mb_per_100k_steps", "mb_to_target",
            "best_returns", "final_eval_returns", "last_fifth_mean")
    return [{"rate": rate, **{k: row[k] for k in keep}, "rescored": row.get("rescored")} for row in d["rows"]]


def ratios(rows: list[dict]) -> list[dict]:
    """Per rate and reference return: A3C's mean time (all seeds reached) over HSA2C's, and its bytes over HSA2C's."""
    out = []
    for rate in dict.fromkeys(r["rate"] for r in rows):
        for target in dict.fromkeys(r["target"] for r in rows if r["rate"] == rate):
            pair = {("a3c" if r["variant"].startswith("DDRL") else "hsa2c"): r
                    for r in rows if r["rate"] == rate and r["target"] == target}
            h, a = pair["hsa2c"], pair["a3c"]
            th, ta = h["time_to_target"], a["time_to_target"]
            out.append({
                "rate": rate, "target": target,
                "hsa2c_s": th["all_mean"], "a3c_s": ta["all_mean"],
                "reached": f"{th['reached']} / {ta['reached']}",
                "a3c_over_hsa2c_time": ta["all_mean"] / th["all_mean"] if th["all_mean"] else None,
                "a3c_over_hsa2c_mb": (a["mb_to_target"] / h["mb_to_target"]
                                      if a["mb_to_target"] and h["mb_to_target"] else None),
                "hsa2c_lower_bound": th["all_lower_bound"], "a3c_lower_bound": ta["all_lower_bound"],
                "holds": f"{holds(h)} / {holds(a)}",
            })
    return out


def holds(row: dict) -> str:
    """How many seeds' final policy scores ≥ 0.9 × their best-checked one on the same fresh episodes (— if not
    rescored)."""
    rescored = row.get("rescored") or []  # absent from runs before rescoring
    if not any(rescored):
        return "—"
    return f"{sum(bool(r) and (r['final_over_best'] or 0) >= 0.9 for r in rescored)}/{len(rescored)}"


def markdown(rows: list[dict], summary: list[dict]) -> str:
    lines = ["| link | reference return | HSA2C s (all seeds) | A3C s (all seeds) | reached (HSA2C / A3C) | "
             "A3C / HSA2C time | A3C / HSA2C MB | HSA2C steps/s | A3C steps/s | final ≥ 0.9 × best (HSA2C / A3C) |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    speed = {(r["rate"], r["variant"].startswith("DDRL")): r["env_steps_per_s"] for r in rows}
    for s in summary:
        gh, ga = ("≥ " if s[f"{v}_lower_bound"] else "" for v in ("hsa2c", "a3c"))
        mb = "—" if s["a3c_over_hsa2c_mb"] is None else f"{s['a3c_over_hsa2c_mb']:.1f}"
        lines.append(f"| {s['rate']} | {s['target']:g} | {gh}{s['hsa2c_s']:.1f} | {ga}{s['a3c_s']:.1f} | "
                     f"{s['reached']} | {'≤ ' if s['hsa2c_lower_bound'] else ''}{s['a3c_over_hsa2c_time']:.2f} | {mb} | "
                     f"{speed[(s['rate'], False)]:.0f} | {speed[(s['rate'], True)]:.0f} | {s.get('holds', '—')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", nargs="+", default=["unshaped", "100mbit"],
                    help="tc rates of the link (both directions), or 'unshaped'")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--budget-scale", type=float, default=2.0, help="hsa2c_vs_sync's --budget-scale (2: 4M steps)")
    ap.add_argument("--time-limit-scale", type=float, default=2.0,
                    help="extra factor on the time guard only (Ray runs are slower; the step budget decides)")
    ap.add_argument("--settings", type=json.loads, default={},
                    help="JSON of HSA2C config fields for both variants, as hsa2c_vs_sync's --settings (the transport "
                         "and the Ray address are this script's)")
    ap.add_argument("--out", default="hsa2c_link")
    ap.add_argument("--timeout", type=float, default=4 * 3600)
    ap.add_argument("--reanalyse", action="store_true",
                    help="no runs: summarise the stored <out>_<rate>.json of --rates (e.g. after an interrupted run)")
    ap.add_argument("--reuse-runs", nargs="+", default=[], metavar="RUN_DIR",
                    help="hsa2c_vs_sync's --reuse-runs: finished run directories (e.g. of a run cut by --timeout) "
                         "that stand for the (variant, seed) they match instead of training it again")
    args = ap.parse_args(argv)
    started = time.monotonic()
    rows: list[dict] = []
    commands: dict[str, str] = {}
    if args.reanalyse:
        for rate in args.rates:
            commands[rate] = json.loads((RESULTS / f"{args.out}_{rate}.json").read_text())["command"]
            rows += rate_rows(f"{args.out}_{rate}", rate)
    else:
        run_rates(args, rows, commands)
    write_summary(args, rows, commands, time.monotonic() - started)
    return 0


def run_rates(args: argparse.Namespace, rows: list[dict], commands: dict[str, str]) -> None:
    """One ``hsa2c_vs_sync`` run per rate of ``--rates`` inside host 0 of a two-host Ray cluster."""
    ok, why = netem.netns_available()
    if not ok:
        sys.exit(f"network namespaces unavailable: {why}")
    with netem.TestHosts(n=2) as hosts, RayCluster(hosts, worker_cpus=2) as cluster:
        for rate in args.rates:
            hosts.shape(rate=None if rate == "unshaped" else rate)
            out = f"{args.out}_{rate}"
            settings = {**args.settings, "transport": "ray", "ray_address": cluster.address}
            argv_run = [sys.executable, str(HERE / "hsa2c_vs_sync.py"), "--envs", ENV, "--variants", "hsa2c", "a3c",
                        "--budget-scale", str(args.budget_scale),
                        "--time-limit-scale", str(args.time_limit_scale), "--seeds", *map(str, args.seeds),
                        "--settings", json.dumps(settings), "--out", out]
            if args.reuse_runs:
                argv_run += ["--reuse-runs", *args.reuse_runs]
            commands[rate] = " ".join(shlex.quote(a) for a in argv_run)
            print(f"[{time.strftime('%H:%M:%S')}] link {rate}: {commands[rate]}", flush=True)
            proc = hosts.run(0, argv_run, text=True, timeout=args.timeout, env=cluster.env, cwd=str(HERE))
            if proc.returncode != 0:
                raise RuntimeError(f"the {rate} run failed (exit {proc.returncode})")
            rows += rate_rows(out, rate)
        hosts.shape()


def write_summary(args: argparse.Namespace, rows: list[dict], commands: dict[str, str], seconds: float) -> None:
    """``<out>.json`` and ``.md``: each rate's rows and the A3C / HSA2C ratios."""
    summary = ratios(rows)
    md = markdown(rows, summary)
    body = {
        "command": " ".join(shlex.quote(a) for a in ["python", "benchmarks/hsa2c_link.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cluster": "Ray head (0 CPUs) + driver with the parameter server in netns host 0, Ray worker node "
                   "(2 CPUs, both workers) in netns host 1; tbf on both egresses; one machine's 2 CPUs",
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "ray": ray.__version__},
        "runs": commands,
        "total_s": seconds,
        "summary": summary,
        "rows": rows,
    }
    (RESULTS / f"{args.out}.json").write_text(json.dumps(body, indent=2) + "\n")
    (RESULTS / f"{args.out}.md").write_text(
        f"# HSA2C vs DDRL A3C across a link ({body['date']})\n\n`{body['command']}`\n\n{md}\n\n"
        f"Per-rate tables: " + ", ".join(f"`{args.out}_{r}.md`" for r in args.rates) + "\n")
    print(md)


if __name__ == "__main__":
    raise SystemExit(main())
