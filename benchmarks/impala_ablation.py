"""Why the V-trace learner did not learn LunarLander, by ablation: from the paper's learner to the default.

    python benchmarks/impala_ablation.py                                   # LunarLander-v3, 1M steps, seed 1
    python benchmarks/impala_ablation.py --env Acrobot-v1 --steps 300000 --seeds 1 2 3 \
        --settings "eq4 (before)" "default (+ 2 epochs x 4 minibatches, clip 0.2)" --extra '{"compress": "int8,onnx", "sync": "aaps"}'
    python benchmarks/impala_ablation.py --report                          # table from the cached runs

Each setting is ``frugalrl train impala`` with the flags below on top of the defaults (learner-copy actors, AAPS
off, every-update sync), one fresh interpreter per run, one run at a time. The first row is the learner this
project had before (one gradient step of the paper's eq. 4 per 160-transition batch, no normalisation); each
further row adds one change, and the last rows take one change away from the default. Reported: final return
(10 deterministic episodes on fresh envs), the stochastic (sampling) return, the mean of the last 100 training
episodes, the best evaluation, and the learner's update seconds. Results: ``benchmarks/results/impala_ablation.json``
and ``.md`` (per env), runs in ``benchmarks/results/impala_ablation/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
CACHE = RESULTS / "impala_ablation"

# Rows run before the default moved from 2 x 4 to 4 x 8 carry explicit flags, so each row means what it says.
# The learner this project had (frugalrl before this change): IMPALA's single step of eq. 4 per batch.
PAPER = {"update_epochs": 1, "num_minibatches": 1, "norm_adv": False, "clip_coef": 1e9, "norm_reward": False,
         "norm_obs": False, "num_steps": 20, "envs_per_worker": 4, "learning_rate": 6e-4}
SETTINGS: dict[str, dict[str, Any]] = {
    "eq4 (before)": PAPER,
    "eq4 + reward scaling": {**PAPER, "norm_reward": True},
    "eq4 + reward scaling + adv norm": {**PAPER, "norm_reward": True, "norm_adv": True},
    "+ batch 512 (8 envs x 32)": {**PAPER, "norm_reward": True, "norm_adv": True, "num_steps": 32,
                                  "envs_per_worker": 8, "learning_rate": 5e-4},
    "+ 2 epochs x 4 minibatches, clip 0.2": {"update_epochs": 2, "num_minibatches": 4},
    "+ gamma 0.999 (2 x 4)": {"update_epochs": 2, "num_minibatches": 4, "gamma": 0.999},
    "default (4 epochs x 8 minibatches of 64)": {},
    "default, vtrace lambda 0.95": {"correct": "vtrace:1:1:0.95"},
    "default + gamma 0.999 (the LunarLander preset)": {"gamma": 0.999},
    "preset without reward scaling": {"gamma": 0.999, "norm_reward": False},
    "preset without adv norm": {"gamma": 0.999, "norm_adv": False},
    "compressed actors rebuilt every 10 updates (before)": {"recompress_kl": None},
    "compressed actors rebuilt on drift, 300 distill steps": {"distill_kl_tol": None},
}


def run(env: str, name: str, flags: dict[str, Any], steps: int, seed: int, force: bool,
        extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run through the CLI (cached); its summary's figures. ``extra``: flags added to the setting's."""
    CACHE.mkdir(parents=True, exist_ok=True)
    flags = {**flags, **(extra or {})}
    slug = "".join(c if c.isalnum() else "_" for c in name)[:60]
    if extra:
        slug += "-" + "".join(c if c.isalnum() else "_" for c in "_".join(f"{k}{v}" for k, v in extra.items()))
    path = CACHE / f"{env}-{slug}-{steps}-s{seed}.json"
    if path.exists() and not force:
        return json.loads(path.read_text())
    run_name = path.stem
    shutil.rmtree(CACHE / "runs" / run_name, ignore_errors=True)  # a rerun's: frugalrl never writes over a run
    cmd = [sys.executable, "-m", "frugalrl.cli", "train", "impala", "--env", env, "--total-timesteps", str(steps),
           "--seed", str(seed), "--eval-episodes", "10", "--run-dir", str(CACHE / "runs"), "--run-name", run_name,
           "--no-progress", "--no-tensorboard", "--no-plots", "--preset", "none",
           "--sync", "every", "--weights-codec", "fp32"]  # the defaults these rows were measured with
    batch = 2 * int(flags.get("envs_per_worker", 8)) * int(flags.get("num_steps", 32))
    cmd += ["--eval-every", str(max(1, steps // 10 // batch))]
    for k, v in flags.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{run_name} failed:\n{done.stderr[-3000:]}")
    s = json.loads((CACHE / "runs" / run_name / "summary.json").read_text())
    out = {"env": env, "setting": name, "extra": extra or {}, "flags": flags, "seed": seed, "steps": steps, "command": " ".join(cmd),
           "final_return": s["eval_return_mean"], "final_std": s["eval_return_std"],
           "stochastic_return": s["stochastic_return_mean"], "train_return_last100": s["train_return_mean_last100"],
           "best_eval": max(e["mean"] for e in s["eval_history"]),
           "eval_history": [{"step": e["step"], "mean": e["mean"]} for e in s["eval_history"]],
           "train_seconds": s["train_seconds"], "learner_update_seconds": s["details"]["learner_update_seconds"],
           "eval_disagreement": s["eval_disagreement"], "process_seconds": time.monotonic() - t0}
    path.write_text(json.dumps(out, indent=1))
    print(f"[{time.strftime('%H:%M:%S')}] {env} {name} s{seed}: final {out['final_return']:.1f} "
          f"(stochastic {out['stochastic_return']:.1f}, train {out['train_return_last100']:.1f}, "
          f"best {out['best_eval']:.1f}) {out['train_seconds']:.0f} s", flush=True)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: one line per (env, steps, setting), means over seeds."""
    lines = ["| env (steps) | setting | extra flags | seeds | final (det.) | stochastic | train (last 100) | best eval | train s | update s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["env"], r["steps"], json.dumps(r.get("extra", {}), sort_keys=True)) for r in rows})
    for env, steps, extra in keys:
        for name in SETTINGS:
            sel = [r for r in rows if r["env"] == env and r["steps"] == steps and r["setting"] == name
                   and json.dumps(r.get("extra", {}), sort_keys=True) == extra]
            if not sel:
                continue

            def m(key: str, sel: list[dict[str, Any]] = sel) -> str:
                vals = [r[key] for r in sel]
                return f"{np.mean(vals):.1f}" + (f" ± {np.std(vals, ddof=1):.1f}" if len(vals) > 1 else "")

            flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in json.loads(extra).items()) or "—"
            lines.append(f"| {env} ({steps / 1e6:g}M) | {name} | {flags} | {len(sel)} | {m('final_return')} | "
                         f"{m('stochastic_return')} | {m('train_return_last100')} | {m('best_eval')} | "
                         f"{np.mean([r['train_seconds'] for r in sel]):.0f} | "
                         f"{np.mean([r['learner_update_seconds'] for r in sel]):.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--env", default="LunarLander-v3")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seeds", nargs="+", type=int, default=[1])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--extra", default="{}", help="JSON of flags added to every setting (e.g. compression, AAPS)")
    p.add_argument("--force", action="store_true")
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    if not args.report:
        for seed in args.seeds:
            for name in args.settings:
                run(args.env, name, SETTINGS[name], args.steps, seed, args.force, json.loads(args.extra))
    rows = [json.loads(f.read_text()) for f in sorted(CACHE.glob("*.json"))]
    md = table(rows)
    (RESULTS / "impala_ablation.md").write_text(md)
    (RESULTS / "impala_ablation.json").write_text(json.dumps({"settings": SETTINGS, "runs": rows}, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
