"""DPSGD speed-up tables (the DPSGD paper, Fig. 1-3): time to a target, by workers (nW) and Hogwild processes (p).

    python benchmarks/dpsgd_speedup.py                                 # this machine: nW, p in {1, 2}
    python benchmarks/dpsgd_speedup.py --task lda --workers 1,2,4,8 --processes 1,2,4 --budget-s 300
    python benchmarks/dpsgd_speedup.py --task hsa2c --seeds 1 2 3 4 5 --workers 1,4,16

Two tasks, each a grid over ``workers × processes`` (asynchronous DPSGD, ``M = 1``):

- ``lda``: DPSVI on a synthetic corpus drawn from a known LDA model (no download); time to a fixed
  held-out perplexity. The reference is serial SVI (``nW = p = B = M = 1``), as in the paper's TSP
  (eq. 12); the grid is repeated for each ``B`` of ``--lda-local-steps``, with ``ρ`` and ``η``
  rescaled from serial SVI's by eq. (13), as the paper does.
- ``hsa2c``: HSA2C on Acrobot-v1 (``--hsa2c-env``); time to a greedy return of -100 (mean of 3
  episodes; random play: -500). The reference is the ``nW = p = 1`` run with the same ``B``; the
  RMSProp step size is not rescaled. (CartPole is too easy to time here: it takes about a second, and
  the initial weights of some seeds already balance the pole.)

Every run evaluates *after* it ends (``deferred_eval``): the logged parameters are scored when the
workers are gone, so the evaluation takes no CPU from them. Time is optimisation time from the end of
worker startup (startup is reported apart). Speed-up = T(reference) / T(run); parallel efficiency =
speed-up / (nW · p), the share of the extra processes' CPU that turned into progress. On a machine with
C cores, runs with more than C processes (and the head) oversubscribe it: efficiency then measures
the cost of that as well. Results: ``benchmarks/results/dpsgd_speedup.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from frugalrl.algos.hsa2c import HSA2CConfig
from frugalrl.algos.hsa2c import train as train_hsa2c
from frugalrl.dpsgd.lda import LDAConfig, fit_lda

RESULTS = Path(__file__).parent / "results"


def ints(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``."""
    return [int(x) for x in text.split(",") if x]


def first_reach(curve: list[tuple[float, int]], target: float, above: bool) -> float | None:
    """Seconds of the first ``(seconds, value)`` at or beyond ``target`` (``above``: ``>=``, else ``<=``)."""
    return next((t for t, v in curve if (v >= target if above else v <= target)), None)


def stats(values: list[float | None], lengths: list[float] | None = None) -> dict[str, Any]:
    """Mean and sample std (ddof = 1) of the times that are not None (``mean``, ``std``), how many reached (``reached``), and
    with ``lengths`` (each run's duration) the mean over *every* run, an unreached one counted at its
    length (``all_mean``; ``all_lower_bound`` says whether any was, so the true mean is at least that)."""
    got = [v for v in values if v is not None]
    out: dict[str, Any] = {
        "mean": float(np.mean(got)) if got else None,
        "std": (float(np.std(got, ddof=1)) if len(got) > 1 else 0.0) if got else None,
        "reached": f"{len(got)}/{len(values)}",
    }
    if lengths is not None:
        every = [length if v is None else v for v, length in zip(values, lengths, strict=True)]
        out["all_mean"] = float(np.mean(every)) if every else None
        out["all_lower_bound"] = len(got) < len(values)
    return out


def run_stats(runs: list[dict[str, Any]], key: str = "time_to_target_s") -> dict[str, Any]:
    """:func:`stats` of ``runs``' times to target, unreached runs counted at their last recorded second."""
    return stats([r[key] for r in runs], [r["curve"][-1][0] if r["curve"] else 0.0 for r in runs])


# ------------------------------------------------------------------------------------------ LDA
def lda_base(args: argparse.Namespace) -> LDAConfig:
    """The serial SVI run every LDA run is a variant of."""
    return LDAConfig(
        corpus="synthetic",
        n_topics=args.lda_topics,
        synthetic_docs=args.lda_docs,
        synthetic_vocab=args.lda_vocab,
        batch_size=64,
        eta=args.lda_eta,
        rho=1.0,
        # the paper's SVI as these tables measured it: constant rates, independent batches, dense pushes
        eta_decay=0.0,
        sampling="uniform",
        update_format="dense",
        global_updates=None,
        time_limit_s=args.budget_s,
        deferred_eval=True,
        log_every=args.lda_log_steps,
        heldout_max_docs=200,
        worker_timeout_s=600.0,
    )


def lda_run(cfg: LDAConfig, target: float) -> dict[str, Any]:
    """One DPSVI run: its time to ``target`` and what it sent."""
    t0 = time.monotonic()
    out = fit_lda(cfg)
    curve = [(t, p) for t, _, p in out["perplexity_curve"]]
    rec = {
        "workers": cfg.workers,
        "processes": cfg.processes,
        "local_steps": cfg.local_steps,
        "seed": cfg.seed,
        "eta": out["eta"],
        "rho": out["rho"],
        "time_to_target_s": first_reach(curve, target, above=False),
        "final_perplexity": out["final_perplexity"],
        "best_perplexity": min(p for _, p in curve),
        "global_updates": out["global_updates"],
        "svi_steps": out["gradient_steps"],
        "svi_steps_per_s": out["gradient_steps"] / max(out["wall_time_s"], 1e-9),
        "staleness_mean": out["staleness"]["mean"],
        "bytes_total": out["bytes"]["total"],
        "startup_s": out["startup_s"],
        "curve": [[round(t, 3), round(p, 2)] for t, p in curve],
        "run_s": time.monotonic() - t0,
    }
    print(
        f"  lda nW={cfg.workers} p={cfg.processes} B={cfg.local_steps} seed={cfg.seed}: "
        f"to {target:.0f} in {_fmt(rec['time_to_target_s'])} s, best {rec['best_perplexity']:.1f}, "
        f"{rec['svi_steps_per_s']:.1f} SVI steps/s",
        flush=True,
    )
    return rec


def lda_table(args: argparse.Namespace) -> dict[str, Any]:
    """Serial SVI, then the nW × p grid; the target is ``--lda-target`` or set from the serial run."""
    base = lda_base(args)
    serial = []
    for seed in args.seeds:
        cfg = replace(base, seed=seed, workers=1, processes=1, local_steps=1, master_batch=1)
        serial.append(lda_run(cfg, args.lda_target or 0.0))
    target = args.lda_target
    if target is None:
        # The perplexity serial SVI reaches at 60% of the budget, plus 1%: every run can reach it.
        cut = 0.6 * args.budget_s
        target = 1.01 * max(min(p for t, p in r["curve"] if t <= cut) for r in serial)
        for r in serial:
            r["time_to_target_s"] = first_reach([(t, p) for t, p in r["curve"]], target, above=False)
    ref = run_stats(serial)
    rows = [{"label": "serial SVI (nW=1 p=1 B=1)", "runs": serial}]
    for B in args.lda_local_steps:
        for nw in args.workers:
            for p in args.processes:
                if nw == p == B == 1:
                    continue  # that is serial SVI
                runs = [
                    lda_run(
                        replace(base, seed=seed, workers=nw, processes=p, local_steps=B, master_batch=1,
                                rescale_from=(1, 1, 1), log_every=max(1, round(args.lda_log_steps / (B * p)))),
                        target,
                    )
                    for seed in args.seeds
                ]
                rows.append({"label": f"nW={nw} p={p} B={B}", "workers": nw, "processes": p, "runs": runs})
    return {"task": "lda", "target": target, "reference_s": ref["all_mean"], "rows": _summarise(rows, ref),
            "corpus": {"docs": args.lda_docs, "vocab": args.lda_vocab, "topics": args.lda_topics},
            "base_config": asdict(base)}


# ------------------------------------------------------------------------------------------ HSA2C
def hsa2c_run(cfg: HSA2CConfig, target: float) -> dict[str, Any]:
    """One HSA2C run: its time to ``target`` (greedy return) and what it sent."""
    return run_record(cfg, train_hsa2c(cfg), target)


def run_record(cfg: HSA2CConfig, s: dict[str, Any], target: float) -> dict[str, Any]:
    """The benchmark record of the HSA2C run ``cfg`` whose summary is ``s`` (``summary.json``)."""
    curve = [(h["seconds"], h["mean"]) for h in s["eval_history"]]
    rec = {
        "workers": cfg.workers,
        "processes": cfg.processes,
        "local_steps": cfg.local_steps,
        "master_batch": cfg.master_batch,
        "synchronous": cfg.synchronous,
        "seed": cfg.seed,
        "time_to_target_s": first_reach(curve, target, above=True),
        "starts_at_target": curve[0][1] >= target,  # the initial weights already do it: time 0 says nothing
        "best_return": max(v for _, v in curve),
        "final_eval_return": s["eval_return_mean"],
        "stochastic_return": s.get("stochastic_return_mean"),
        "global_updates": s["details"]["global_updates"],
        "env_steps": s["env_steps"],
        "env_steps_per_s": s["steps_per_second"],
        "bytes_total": s["bytes"]["total"],
        "bytes_per_update": s["details"]["bytes_per_update"],
        "staleness_mean": s["details"]["staleness"]["mean"],
        "startup_s": s["details"]["startup_seconds"],
        "curve": [[round(t, 3), round(v, 1)] for t, v in curve],
        "run_dir": s.get("run_dir"),
    }
    print(
        f"  {cfg.env} nW={cfg.workers} p={cfg.processes} B={cfg.local_steps} M={cfg.master_batch}"
        f"{' sync' if cfg.synchronous else ''} seed={cfg.seed}: to {target:g} in "
        f"{_fmt(rec['time_to_target_s'])} s, best {rec['best_return']:.1f}, {rec['env_steps_per_s']:.0f} steps/s, "
        f"{rec['bytes_per_update'] / 1e3:.1f} kB/update",
        flush=True,
    )
    return rec


def timed_hsa2c(env: str, budget_s: float, eval_every_s: float, check_episodes: int = 3, **fields: Any) -> HSA2CConfig:
    """An HSA2C run for timing: ``budget_s`` seconds, async (``M = 1``), evaluated after the run on
    ``check_episodes`` greedy episodes at the first global update after every ``eval_every_s`` seconds of
    training (the same cadence whatever a global update is), no figures or TensorBoard; ``fields`` override
    the rest."""
    return HSA2CConfig(
        env=env,
        master_batch=1,
        global_updates=None,
        time_limit_s=budget_s,
        deferred_eval=True,
        eval_every_s=eval_every_s,
        log_eval_episodes=check_episodes,
        eval_episodes=10,
        run_dir=str(RESULTS / "runs"),
        progress=False,
        tensorboard=False,
        plots=False,
        **fields,
    )


def hsa2c_base(args: argparse.Namespace) -> HSA2CConfig:
    """The HSA2C run every grid run is a variant of."""
    return timed_hsa2c(args.hsa2c_env, args.hsa2c_budget_s, args.hsa2c_eval_every_s,
                       local_steps=args.hsa2c_local_steps)


def hsa2c_table(args: argparse.Namespace) -> dict[str, Any]:
    """The nW × p grid; the reference is nW = p = 1."""
    base = hsa2c_base(args)
    rows = []
    for nw in args.workers:
        for p in args.processes:
            runs = [
                hsa2c_run(replace(base, seed=seed, workers=nw, processes=p), args.hsa2c_target)
                for seed in args.seeds
            ]
            rows.append({"label": f"nW={nw} p={p} B={base.local_steps}", "workers": nw, "processes": p, "runs": runs})
    ref = run_stats(rows[0]["runs"])
    return {"task": "hsa2c", "env": base.env, "target": args.hsa2c_target, "reference_s": ref["all_mean"],
            "rows": _summarise(rows, ref), "base_config": asdict(base)}


# ------------------------------------------------------------------------------------------ tables
def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def _summarise(rows: list[dict[str, Any]], ref: dict[str, Any]) -> list[dict[str, Any]]:
    """Add time-to-target statistics, speed-up against the reference's :func:`run_stats` ``ref`` and parallel
    efficiency to each row. Times average every seed (unreached ones at the run's length), so a speed-up is
    a bound when a side has unreached seeds: ``speedup_bound`` ``"at most"`` (only the row's), ``"at least"``
    (only the reference's), ``"unknown"`` (both), None (exact)."""
    for row in rows:
        t = run_stats(row["runs"])
        row["time_to_target"] = t
        procs = row.get("workers", 1) * row.get("processes", 1)
        row["all_processes"] = procs
        row["speedup"] = ref["all_mean"] / t["all_mean"] if ref["all_mean"] and t["all_mean"] else None
        row["speedup_bound"] = {
            (False, False): None, (True, False): "at most", (False, True): "at least", (True, True): "unknown",
        }[(t["all_lower_bound"], ref["all_lower_bound"])]
        row["efficiency"] = row["speedup"] / procs if row["speedup"] else None
        row["bytes_total_mean"] = float(np.mean([r["bytes_total"] for r in row["runs"]]))
    return rows


def markdown(table: dict[str, Any]) -> str:
    """The table of one task as markdown."""
    unit = "perplexity" if table["task"] == "lda" else "greedy return"
    rate_key, rate_name = ("svi_steps_per_s", "SVI steps/s") if table["task"] == "lda" else ("env_steps_per_s", "env steps/s")
    lines = [
        f"**{table['task']}**: time to {unit} {table['target']:.1f} "
        f"(reference {_fmt(table['reference_s'], '.2f')} s over every seed)",
        "",
        "Times average every seed; a seed that never reached the target counts at its run's length (≥: a lower",
        "bound), and speed-ups built from such a mean are bounds (≤, ≥; ? when both sides are).",
        "",
        f"| run | processes | time to target, reached seeds (s) | reached | time, all seeds (s) | speed-up | "
        f"efficiency | {rate_name} | MB sent |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    marks = {None: "", "at most": "≤ ", "at least": "≥ ", "unknown": "? "}
    for row in table["rows"]:
        t = row["time_to_target"]
        time_txt = "—" if t["mean"] is None else f"{t['mean']:.2f} ± {t['std']:.2f}"
        every = f"{'≥ ' if t['all_lower_bound'] else ''}{t['all_mean']:.2f}"
        lines.append(
            f"| {row['label']} | {row['all_processes']} | {time_txt} | {t['reached']} | {every} | "
            f"{marks[row['speedup_bound']]}{_fmt(row['speedup'], '.2f')} | {_fmt(row['efficiency'], '.2f')} | "
            f"{np.mean([r[rate_key] for r in row['runs']]):.1f} | {row['bytes_total_mean'] / 1e6:.1f} |"
        )
    return "\n".join(lines)


def save_results(out: str, title: str, body: dict[str, Any], md: str, started: float) -> None:
    """Write ``RESULTS/<out>.json`` (``body`` with the command, date, machine and duration) and ``.md``."""
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "total_s": round(time.time() - started, 1),
        **body,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{out}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{out}.md").write_text(
        f"# {title} ({result['date']}, {os.cpu_count()} CPUs)\n\n`{result['command']}`\n\n{md}\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["lda", "hsa2c", "both"], default="both")
    ap.add_argument("--workers", type=ints, default=[1, 2], help="worker counts nW (comma-separated)")
    ap.add_argument("--processes", type=ints, default=[1, 2], help="Hogwild processes per worker p")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="seeds (default: 0 1 for lda, 1 2 3 for hsa2c)")
    ap.add_argument("--budget-s", type=float, default=20.0, help="LDA: optimisation seconds per run")
    ap.add_argument("--lda-docs", type=int, default=4000)
    ap.add_argument("--lda-vocab", type=int, default=1000)
    ap.add_argument("--lda-topics", type=int, default=20)
    ap.add_argument("--lda-eta", type=float, default=0.1, help="serial SVI rate η (the paper's best: 0.1)")
    ap.add_argument("--lda-local-steps", type=ints, default=[1, 5], help="B values of the grid runs")
    ap.add_argument("--lda-log-steps", type=int, default=10, help="evaluate about every this many SVI steps")
    ap.add_argument("--lda-target", type=float, default=None,
                    help="target perplexity (default: serial SVI's at 60%% of the budget, +1%%)")
    ap.add_argument("--hsa2c-budget-s", type=float, default=20.0, help="HSA2C: training seconds per run")
    ap.add_argument("--hsa2c-local-steps", type=int, default=10)
    ap.add_argument("--hsa2c-eval-every-s", type=float, default=0.5, help="training seconds between evaluations")
    ap.add_argument("--hsa2c-env", default="Acrobot-v1")
    ap.add_argument("--hsa2c-target", type=float, default=-100.0)
    ap.add_argument("--out", default="dpsgd_speedup")
    ap.add_argument("--reanalyse", action="store_true",
                    help="recompute <out>.json's tables from its stored runs (their curves), no training")
    args = ap.parse_args(argv)

    tables = []
    started = time.time()
    if args.reanalyse:  # today's statistics over stored runs
        old = json.loads((RESULTS / f"{args.out}.json").read_text())
        for table in old["tables"]:
            rows = [{"label": row["label"], "workers": row.get("workers", 1), "runs": row["runs"],
                     # older files: "threads" was p and "processes" all processes
                     "processes": row.get("threads", row.get("processes", 1))} for row in table["rows"]]
            ref = run_stats(rows[0]["runs"])
            tables.append({**table, "reference_s": ref["all_mean"], "rows": _summarise(rows, ref)})
        runs_from = old.get("runs_from") or {k: old[k] for k in ("command", "date", "machine", "total_s")}
        md = "\n\n".join(markdown(t) for t in tables)
        save_results(args.out, "DPSGD speed-up", {"runs_from": runs_from, "tables": tables}, md, started)
        print(md)
        return 0
    if args.task in ("lda", "both"):
        tables.append(lda_table(replace_seeds(args, [0, 1])))
    if args.task in ("hsa2c", "both"):
        tables.append(hsa2c_table(replace_seeds(args, [1, 2, 3])))
    md = "\n\n".join(markdown(t) for t in tables)
    save_results(args.out, "DPSGD speed-up", {"tables": tables}, md, started)
    print(md)
    return 0


def replace_seeds(args: argparse.Namespace, default: list[int]) -> argparse.Namespace:
    """``args`` with ``seeds`` set to ``default`` when none were given."""
    out = argparse.Namespace(**vars(args))
    out.seeds = args.seeds or default
    return out


if __name__ == "__main__":
    raise SystemExit(main())
