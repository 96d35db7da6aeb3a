"""HSA2C (B local steps, asynchronous) against the paper's B = 1 baselines: time and bytes to a reference return.

    python benchmarks/hsa2c_vs_sync.py                        # CartPole-v1 and LunarLander-v3, 5 seeds
    python benchmarks/hsa2c_vs_sync.py --envs CartPole-v1 --seeds 1 3 4 --variants hsa2c a3c
    python benchmarks/hsa2c_vs_sync.py --envs LunarLander-v3 --variants hsa2c --settings '{"eta_decay": 0.5}' --out x

Every variant is the same code (:mod:`frugalrl.algos.hsa2c` on :mod:`frugalrl.dpsgd`) with ``nW`` workers
of ``p = 1`` process each; only the DPSGD settings differ:

- ``hsa2c``: ``B = --local-steps`` (10), ``M = 1``, asynchronous master;
- ``a3c``: DDRL A3C as the DPSGD paper defines its baseline (Adamski et al.): ``B = 1``, ``M = 1``,
  asynchronous, i.e. HSA2C with B = 1: every gradient goes to the master and comes back as weights;
- ``sync``: the synchronous variant: ``B = 1``, ``M = nW``, every global update takes one update from
  each worker, all computed from the same weights (a barrier per gradient).

Fair cadence. Every variant is evaluated at the first global update after every ``eval_every_s`` seconds
of training (``HSA2CConfig.eval_every_s``), whatever a global update is worth, on ``--check-episodes`` greedy
episodes (10, as many as the final evaluation, so that the best check is not the luckiest of many small samples);
evaluation runs after training (``deferred_eval``), so it is never in the timed path and takes no CPU
from the workers (the parameters are kept and scored once the workers are gone). Time is training time
from the end of worker startup. The reference return is reached at the first evaluation that meets it.
Bytes are everything both ways on the wire (weights down, update vectors up, control); "MB to
reference" is each run's byte rate times its own time to the reference. Runs that never reach the
reference are counted: "reached" says how many did, and "time (all seeds)" counts an unreached run at
its whole training time (a lower bound, marked ≥). Every variant runs the same env steps (``steps`` in
``ENVS``; the time limit is only a guard), so the slower variants train for longer. "final" is the 10-episode greedy evaluation of the last
weights; "final / best" compares it with the best check of the run (≥ 0.9 holds the return). The best check is the
luckiest of ~100 noisy ones, so that ratio is biased low: each run's best-checked policy (``best.pt``) and its final
one are also scored again on the same ``--rescore-episodes`` (100) fresh greedy episodes, after training.
Results: ``benchmarks/results/<out>.json`` and ``.md`` (``--out``, default ``hsa2c_vs_sync``). ``--reuse-runs`` takes
finished run directories (e.g. those of a run cut short) in place of training the (variant, seed) whose settings they
match; their records say ``reused`` and the JSON lists them. ``--merge A B --out C`` recomputes the table over the stored
runs of results A and B together (e.g. seeds 1-5 and 6-10 of one setting), without training.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from dpsgd_speedup import RESULTS, _fmt, first_reach, hsa2c_run, run_record, save_results, stats, timed_hsa2c

from frugalrl.algos import load_policy
from frugalrl.algos.hsa2c import HSA2CConfig
from frugalrl.envs.spec import to_env_spec
from frugalrl.evaluation import FRESH_SEED, PolicyEvaluator, regression_recheck
from frugalrl.runs import BEST, read_checkpoint, read_config

ENVS: dict[str, dict[str, Any]] = {
    # reference returns, env-step budget, time limit (s; a guard), evaluation period (training seconds), settings
    "CartPole-v1": {"targets": [475.0], "steps": 500_000, "budget_s": 60.0, "eval_every_s": 0.5, "settings": {}},
    "LunarLander-v3": {
        "targets": [0.0, 200.0],
        "steps": 2_000_000,
        "budget_s": 240.0,
        "eval_every_s": 2.0,
        # HSA2C's own defaults, what `frugalrl train hsa2c` runs. Until 2026-11-25 these runs used rl-zoo's A2C
        # settings, {"gamma": 0.995, "ent_coef": 1e-4, "num_steps": 8, "eta": 7e-4} (pass them with --settings to replay
        # the result files of before): 2 of 5 seeds never reached 200 in some 5-seed runs, where the defaults
        # reached it on 5 of 5 (hsa2c_vs_sync_library_defaults.json).
        "settings": {},
    },
    # HSA2C's defaults (since 2026-11-25 the MinAtar paper's CNN on the 10×10×4 grid; before, an MLP: add
    # {"net": "mlp"} with --settings to replay hsa2c_vs_sync_minatar.json); not in the default --envs
    "MinAtar-Breakout": {
        "env": "frugalrl.envs.minatar:make_minatar",
        "targets": [5.0, 10.0],
        "steps": 1_000_000,
        "budget_s": 900.0,
        "eval_every_s": 5.0,
        "settings": {"env_kwargs": {"game": "breakout"}},
    },
}
DEFAULT_ENVS = ("CartPole-v1", "LunarLander-v3")
VARIANTS = ("hsa2c", "a3c", "sync")
NOT_MATCHED = {"ray_address", "run_dir", "run_name", "_meta", "algo"}
"""Config keys a reused run may differ in (``--reuse-runs``): where it ran and what it was called."""


def variants(env: str, args: argparse.Namespace) -> list[tuple[str, HSA2CConfig]]:
    """The HSA2C config of ``env`` and its B = 1 baselines (asynchronous DDRL A3C, synchronous), by ``--variants``."""
    spec = ENVS[env]
    hsa2c = timed_hsa2c(spec.get("env", env), spec["budget_s"], spec["eval_every_s"], args.check_episodes,
                        workers=args.workers, processes=1,
                        local_steps=args.local_steps, total_timesteps=spec["steps"],
                        **{**spec["settings"], **json.loads(args.settings)})
    every = {
        "hsa2c": (f"HSA2C B={args.local_steps}", hsa2c),
        "a3c": ("DDRL A3C B=1 (async)", replace(hsa2c, local_steps=1)),
        "sync": ("sync B=1", hsa2c.as_synchronous_baseline()),
    }
    return [every[v] for v in args.variants]


def finished_runs(dirs: list[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(config.json, summary.json)`` of each run directory of ``--reuse-runs``; exits naming one that did not finish."""
    out = []
    for d in map(Path, dirs):
        if not (d / "summary.json").is_file() or not (d / "config.json").is_file():
            raise SystemExit(f"--reuse-runs: {d} lacks config.json or summary.json (the run did not finish)")
        out.append((json.loads((d / "config.json").read_text()), json.loads((d / "summary.json").read_text())))
    return out


def reused_summary(cfg: HSA2CConfig, finished: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any] | None:
    """The summary of a finished run whose config is ``cfg`` (but for :data:`NOT_MATCHED`), or None. A field the run's
    config.json lacks (added to HSA2CConfig since) counts at its default, which keeps the behaviour of before."""
    want = {k: v for k, v in json.loads(json.dumps(asdict(cfg))).items() if k not in NOT_MATCHED}
    default = json.loads(json.dumps(asdict(HSA2CConfig())))
    return next((summary for config, summary in finished
                 if {k: config.get(k, default.get(k)) for k in want} == want), None)


def rescore(run_dir: str | None, episodes: int) -> dict[str, Any] | None:
    """The run's best-checked policy (``checkpoints/best.pt``) and its final one (``latest.pt``) scored again on the
    same ``episodes`` fresh greedy episodes (from ``FRESH_SEED``, ``frugalrl eval``'s), as a run rechecks a
    regression (:meth:`PolicyEvaluator.compare`, :func:`regression_recheck`). The best check is the luckiest of ~100
    noisy ones, so "final / best" against it is biased low; against the best policy's score on new episodes it is
    not. None when the run kept no ``best.pt``."""
    if episodes < 1 or run_dir is None or not (Path(run_dir) / "checkpoints" / BEST).is_file():
        return None
    config = read_config(run_dir)
    final_agent, _ = load_policy(run_dir, "latest")
    evaluator = PolicyEvaluator(final_agent, to_env_spec(config["env"], config.get("env_kwargs") or {}), episodes,
                                FRESH_SEED)
    best, final = evaluator.compare(read_checkpoint(run_dir, BEST)["parts"]["agent"], FRESH_SEED)
    check = regression_recheck(best, final)
    return {"episodes": episodes, "seed": FRESH_SEED, "best": best.mean, "final": final.mean,
            "difference_se": check["error"],  # the same episodes for both: the paired difference's standard error
            "final_over_best": final.mean / best.mean if best.mean > 0 else None}


def with_rescore(record: dict[str, Any], episodes: int) -> dict[str, Any]:
    """``record`` with its ``rescored`` entry (:func:`rescore`), unless it has one or ``episodes`` is 0."""
    if record.get("rescored") is None and episodes > 0:
        record = {**record, "rescored": rescore(record.get("run_dir"), episodes)}
        if record["rescored"] is not None:
            r = record["rescored"]
            print(f"  seed {record['seed']}: rescored on {episodes} fresh episodes: best.pt {r['best']:.1f}, "
                  f"final {r['final']:.1f}", flush=True)
    return record


def summarise(env: str, label: str, config: dict[str, Any], runs: list[dict[str, Any]], target: float) -> dict:
    """One table row: ``runs`` of one variant against one reference return."""
    times = [first_reach([(t, v) for t, v in r["curve"]], target, above=True) for r in runs]
    t = stats(times, [r["env_steps"] / r["env_steps_per_s"] for r in runs])
    rates = [r["bytes_total"] / (r["env_steps"] / r["env_steps_per_s"]) for r in runs]
    mb_to = [rate * x / 1e6 for rate, x in zip(rates, times, strict=True) if x is not None]
    finals = [r["final_eval_return"] for r in runs]
    bests = [r["best_return"] for r in runs]
    tails = [last_fifth(r["curve"]) for r in runs]
    return {
        "env": env,
        "variant": label,
        "target": target,
        "time_to_target": t,
        "time_all_seeds": {"mean": t["all_mean"], "lower_bound": t["all_lower_bound"]},
        "times": times,  # (each run's own time_to_target_s is for the first reference return)
        "env_steps_per_s": _mean(runs, "env_steps_per_s"),
        "kb_per_update": _mean(runs, "bytes_per_update") / 1e3,
        "mb_per_100k_steps": sum(r["bytes_total"] for r in runs) / sum(r["env_steps"] for r in runs) * 1e5 / 1e6,
        "mb_to_target": float(np.mean(mb_to)) if mb_to else None,
        "staleness_mean": _mean(runs, "staleness_mean"),
        "best_returns": bests,
        "final_eval_returns": finals,
        "final_over_best": [f / b if b > 0 else None for f, b in zip(finals, bests, strict=True)],
        "rescored": [r.get("rescored") for r in runs],
        "last_fifth": tails,
        "last_fifth_mean": float(np.mean([t["mean"] for t in tails])),
        "last_fifth_std": float(np.mean([t["std"] for t in tails])),
        "config": config,
        "runs": runs,
    }


def last_fifth(curve: list[list[float]]) -> dict[str, float]:
    """Mean, standard deviation and minimum of the returns of a run's last fifth of checks: whether the run holds
    what it learned (a final / best ratio rests on one check against the luckiest of ~100)."""
    returns = np.array([v for _, v in curve], dtype=np.float64)
    tail = returns[int(0.8 * returns.size):]
    return {"mean": float(tail.mean()), "std": float(tail.std()), "min": float(tail.min()), "checks": int(tail.size)}


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in runs) / len(runs)


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per (env, variant, reference return)."""
    lines = [
        "| env | variant | reference return | time to reference (s, reached) | reached | time (all seeds) | "
        "env steps/s | kB per global update | MB per 100k env steps | MB to reference | staleness | "
        "best check / final (10 ep.) | final / best | best.pt / final on the same fresh episodes (final / best) | "
        "last fifth of checks: mean, within-run std (per-seed means) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    for row in rows:
        t = row["time_to_target"]
        time_txt = "—" if t["mean"] is None else f"{t['mean']:.1f} ± {t['std']:.1f}"
        every = row["time_all_seeds"]
        ratios = " ".join("—" if x is None else f"{x:.2f}" for x in row["final_over_best"])
        rescored = ("—" if not any(row.get("rescored") or []) else
                    " ".join("—" if r is None else f"{r['best']:.0f}/{r['final']:.0f}"
                             f" ({'—' if r['final_over_best'] is None else format(r['final_over_best'], '.2f')})"
                             for r in row["rescored"]))
        tail_means = " ".join(f"{t['mean']:.0f}" for t in row["last_fifth"])
        lines.append(
            f"| {row['env']} | {row['variant']} | {row['target']:g} | {time_txt} | {t['reached']} | "
            f"{'≥ ' if every['lower_bound'] else ''}{every['mean']:.1f} | "
            f"{row['env_steps_per_s']:.0f} | {row['kb_per_update']:.1f} | {row['mb_per_100k_steps']:.1f} | "
            f"{_fmt(row['mb_to_target'])} | {row['staleness_mean']:.2f} | "
            f"{' '.join(f'{b:.0f}' for b in row['best_returns'])} / "
            f"{' '.join(f'{x:.0f}' for x in row['final_eval_returns'])} | {ratios} | {rescored} | "
            f"{row['last_fifth_mean']:.0f}, std {row['last_fifth_std']:.0f} "
            f"({tail_means}) |"
        )
    return "\n".join(lines)


def stored_groups(names: list[str], rescore_episodes: int) -> tuple[list[tuple[str, str, dict, list]], Any]:
    """The ``(env, variant, config, runs)`` groups of stored results ``names`` (runs of one env and variant
    concatenated, in the order given; a seed twice raises), and where their runs came from."""
    groups: dict[tuple[str, str], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    sources = []
    for name in names:
        old = json.loads((RESULTS / f"{name}.json").read_text())
        sources.append(old.get("runs_from") or {k: old.get(k) for k in ("command", "date", "machine", "total_s")})
        for row in old["rows"]:
            if row["target"] != ENVS[row["env"]]["targets"][0]:
                continue
            config, runs = groups.setdefault((row["env"], row["variant"]), (row["config"], []))
            seeds = {r["seed"] for r in runs}
            for r in row["runs"]:
                if r["seed"] in seeds:
                    raise SystemExit(f"--merge: {row['env']} {row['variant']} seed {r['seed']} is in two results")
                runs.append(with_rescore(r, rescore_episodes))
    return ([(env, label, config, runs) for (env, label), (config, runs) in groups.items()],
            sources[0] if len(names) == 1 else dict(zip(names, sources, strict=True)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS), choices=list(ENVS))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--local-steps", type=int, default=10, help="B of HSA2C")
    ap.add_argument("--settings", default="{}", help="JSON of HSA2CConfig fields over every env's settings")
    ap.add_argument("--check-episodes", type=int, default=10,
                    help="greedy episodes of each cadence evaluation (10: the final evaluation's; 3: before 2026-11-24)")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply every env's step and time budgets")
    ap.add_argument("--time-limit-scale", type=float, default=1.0,
                    help="multiply every env's time guard only (slower transports; the step budget still decides)")
    ap.add_argument("--out", default="hsa2c_vs_sync")
    ap.add_argument("--reanalyse", action="store_true",
                    help="recompute the table from <out>.json's stored curves (e.g. after changing ENVS targets)")
    ap.add_argument("--rescore-episodes", type=int, default=100,
                    help="score each run's best-checked and final policies again on this many fresh greedy "
                         "episodes, the same for both (0: off; --reanalyse rescores runs that lack it)")
    ap.add_argument("--merge", nargs="+", default=[], metavar="RESULT",
                    help="recompute the table, as --reanalyse does, over the runs of these stored results together "
                         "(names under benchmarks/results, e.g. seeds 1-5 and 6-10 of one setting), into --out")
    ap.add_argument("--reuse-runs", nargs="+", default=[], metavar="RUN_DIR",
                    help="finished run directories to take instead of training a (variant, seed) whose config they "
                         "match (all but where it ran), e.g. the finished runs of an interrupted benchmark")
    args = ap.parse_args(argv)
    for spec in ENVS.values():
        spec["budget_s"] *= args.budget_scale * args.time_limit_scale
        spec["steps"] = int(spec["steps"] * args.budget_scale)

    started = time.time()
    body: dict[str, Any] = {}
    if args.reanalyse or args.merge:  # new reference returns over the stored runs (their curves), no training
        groups, body["runs_from"] = stored_groups(args.merge or [args.out], args.rescore_episodes)
    else:
        groups = []
        finished = finished_runs(args.reuse_runs)
        for env in args.envs:  # seed-major: the variants of one seed run back to back (same machine load)
            configs = variants(env, args)
            runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in configs}
            for seed in args.seeds:
                for label, cfg in configs:
                    cfg, target = replace(cfg, seed=seed), ENVS[env]["targets"][0]
                    summary = reused_summary(cfg, finished)
                    if summary is None:
                        record = hsa2c_run(cfg, target)
                    else:
                        print(f"  {label} seed {seed}: reusing {summary['run_dir']}", flush=True)
                        record = {**run_record(cfg, summary, target), "reused": True}
                        body.setdefault("reused_runs", []).append(summary["run_dir"])
                    runs[label].append(with_rescore(record, args.rescore_episodes))
            groups += [(env, label, asdict(cfg), runs[label]) for label, cfg in configs]
    rows = [summarise(env, label, config, runs, target)
            for env, label, config, runs in groups for target in ENVS[env]["targets"]]
    md = markdown(rows)
    save_results(args.out, "HSA2C vs DDRL A3C (B = 1, asynchronous) and synchronous B = 1", {**body, "rows": rows},
                 md, started)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
