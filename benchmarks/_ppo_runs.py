"""Shared by the PPO benchmarks: run a PPO config once, cache its summary as JSON, reload it later."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from frugalrl.algos.ppo import PPOConfig
from frugalrl.config import is_flag

RESULTS = Path(__file__).parent / "results"

# LunarLander-v3 settings (rl-zoo-like: γ=0.999, λ=0.98, minibatches of 64), 4 workers × 4 envs.
LUNAR = PPOConfig(
    env="LunarLander-v3",
    total_timesteps=1_000_000,
    workers=4,
    envs_per_worker=4,
    num_steps=128,
    num_minibatches=32,
    update_epochs=4,
    learning_rate=5e-4,
    gamma=0.999,
    gae_lambda=0.98,
    ent_coef=0.01,
    eval_every=20,
    eval_episodes=10,
    progress=False,
    tensorboard=False,
)


def run_name(cfg: PPOConfig) -> str:
    """A stable name for a config's run (sync rule, threshold, workers, steps, seed)."""
    rule = cfg.sync if cfg.sync != "aaps" else f"aaps{cfg.kl_threshold:g}"
    return f"{cfg.env}-{rule}-w{cfg.workers}x{cfg.envs_per_worker}-t{cfg.total_timesteps}-s{cfg.seed}"


def run_or_load(cfg: PPOConfig, cache_dir: Path, force: bool = False) -> dict:
    """Train ``cfg`` unless its summary is cached in ``cache_dir``; return the summary."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    name = run_name(cfg)
    path = cache_dir / f"{name}.json"
    if path.exists() and not force:
        return json.loads(path.read_text())
    cfg = replace(cfg, run_dir=str(RESULTS / "runs"), run_name=name)
    shutil.rmtree(RESULTS / "runs" / name, ignore_errors=True)  # a rerun's: frugalrl never writes over a run
    t0 = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] training {name} ...", flush=True)
    # Each run in a fresh interpreter, through the CLI, exactly as a user would start it.
    subprocess.run([sys.executable, "-m", "frugalrl.cli", "train", "ppo", *config_flags(cfg)], check=True,
                   stdout=subprocess.DEVNULL)
    summary = json.loads((Path(cfg.run_dir) / name / "summary.json").read_text())
    summary["config"] = asdict(cfg)
    path.write_text(json.dumps(summary, indent=2))
    print(
        f"[{time.strftime('%H:%M:%S')}] {name}: eval {summary['eval_return_mean']:.1f} "
        f"in {time.time() - t0:.0f} s, syncs {summary['weight_syncs']['total']}",
        flush=True,
    )
    return summary


def config_flags(cfg: PPOConfig) -> list[str]:
    """CLI flags that reproduce ``cfg`` (``frugalrl train ppo <flags>``)."""
    flags = []
    for f in fields(cfg):
        if not is_flag(f):
            continue
        value = getattr(cfg, f.name)
        if isinstance(value, dict):
            value = json.dumps(value)
        elif isinstance(value, list):
            value = ",".join(map(str, value))
        flags += ["--" + f.name.replace("_", "-"), str(value)]
    return flags


def time_to_target(summary: dict, target: float) -> tuple[int | None, float | None]:
    """First evaluation step (and wall second, from metrics) at which the mean return reached ``target``."""
    run_dir = Path(summary["run_dir"])
    rows = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    for row in rows:
        if row.get("eval/return_mean") is not None and row["eval/return_mean"] >= target:
            return row["step"], row["time"]
    return None, None
