"""What a run with no flags gets, on envs the learning suite does not report: PPO's defaults (its fallback per
family of envs, frugal weight syncs on) against the same with every-update fp32 weights and against SB3's PPO with
its plain defaults; same machine, same steps, same evaluation.

    python benchmarks/family_defaults.py                                  # every env and seed, PPO's sides
    python benchmarks/family_defaults.py --envs Hopper-v5 --seeds 101     # one env, one seed
    python benchmarks/family_defaults.py --sides impala impala-every --envs CartPole-v1 Acrobot-v1  # IMPALA
    python benchmarks/family_defaults.py --report                         # the table from the cached runs

Sides, each run a fresh interpreter, one after the other (never two at once), torch on one thread on both:

- ``frugal``: ``frugalrl train ppo --env X --total-timesteps N --seed S`` and the output flags only: AAPS,
  bf16 delta-coded weights. Where no preset exists for X (the MuJoCo envs) the fallback of X's family applies
  (``continuous``: ``_families`` in ``frugalrl/presets/ppo.json``); Acrobot-v1 has rl-zoo's preset;
- ``frugal-every``: the same with ``--sync every --weights-codec fp32`` (full fp32 weights after every update, the
  default before AAPS + bf16 became it), which isolates what the frugal default costs in return;
- ``frugal-nopreset``: ``frugal`` with ``--preset family:F``, F the env's family: on an env that has a preset, what
  the same command gives an env nobody tuned (the learning suite's envs: ``--envs CartPole-v1 ... --steps N``);
- ``frugal-nopreset-image``: MinAtar's grids with the ``image`` fallback, what they got before the ``grid``
  family (chosen on MinAtar Space Invaders with the ``frugal-discrete`` side, whose settings it has);
- ``frugal-discrete``: the same with ``--preset family:discrete``; ``frugal-discrete-sb3`` with SB3's PPO defaults
  on top, the candidate chosen on Acrobot-v1 against the discrete fallback of the time (CleanRL ``ppo.py``'s
  settings, its runs cached as ``frugal-discrete-cleanrl``), and that fallback since (``--sides``);
- ``continuous`` and ``continuous-*``: the validation of the ``continuous`` fallback. ``continuous`` is the
  fallback until 2026-12-02 (CleanRL's settings, :data:`CLEANRL_CONT`), each other side a variant of it:
  ``-constant-lr`` (no annealing), ``-raw-reward`` (no reward normalisation), ``-reward-only`` (constant rate, no
  observation normalisation), ``-sb3`` (all three: SB3's plain defaults), on envs the suite does not report,
  tuning seeds (``--sides``); ``frugal-nopreset-constant-lr``, cached, is the constant rate tried on
  LunarLanderContinuous-v3 with no preset; ``-value-norm`` (the critic's targets standardised instead of the
  rewards; chosen on the tuning seeds, then run on report seeds of Hopper-v5 and LunarLanderContinuous-v3, where it
  lost, so not kept), ``-sb3-value-norm`` (the same on SB3's plain defaults; report seeds stopped at
  MountainCarContinuous-v0, where it stood still) and ``-obs-value-norm`` (that with observations normalised: the
  fallback since 2026-12-02); ``-obs-value-norm-every`` (that with every-update fp32 weights) and ``-sb3-obs``
  (SB3's settings with observations normalised alone) take apart its LunarLanderContinuous-v3 gap. The cached
  rows of the sides that take the family (``frugal``, ``frugal-every``, ``frugal-nopreset``, ``frugal-obs-*``,
  ``frugal-w8*``) on continuous-action envs without a preset ran the old fallback: they are from before that date;
- ``impala`` and ``impala-every``: the same two with ``frugalrl train impala`` (``--sides``);
- ``hsa2c-fp32`` and ``hsa2c-bf16``: ``frugalrl train hsa2c`` with its pushed updates and pulled parameters in
  fp32, or in bf16 (``--update-codec``, ``--pull-codec``), and ``hsa2c-bf16-push`` (bf16 pushes, compressed, with
  fp32 pulls), which chose HSA2C's codecs; ``hsa2c`` (no flags) and
  ``hsa2c-old`` (fp32 both ways, full pulls: the defaults before) for their bytes (``--sides``);
- ``sb3``: ``PPO("MlpPolicy", make_vec_env(X, n_envs=1, seed=S), seed=S, device="cpu")``: SB3's defaults;
  ``sb3-norm-obs``: the same env in ``VecNormalize(norm_obs=True, norm_reward=False)`` (its statistics frozen for
  the evaluation), SB3's own observation normalisation, set against ``continuous-sb3-obs``.
  The MinAtar games (``MinAtar-Breakout``, the learning suite's key; Space Invaders and Asterix) are built by their
  factory on both sides
  (:data:`FACTORIES`).

Evaluation: ``EVAL_EPISODES`` deterministic episodes after the last update. frugalrl plays them on a fresh env
seeded ``10000 + S + i`` (its run evaluation); SB3's ``evaluate_policy(deterministic=True)`` on a fresh
one-env vector env seeded ``10000 + S`` once (its later resets continue that env's generator). Each run's result
is cached in ``benchmarks/results/family_defaults/``; ``benchmarks/results/family_defaults.json`` holds them all
with the commit, date, machine and commands.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _commit import measured_commit
from _sb3 import EVAL_EPISODES
from learning_suite import ENVS as SUITE_ENVS
from learning_suite import MINATAR, return_ratio

RESULTS = Path(__file__).parent / "results"
CACHE = RESULTS / "family_defaults"
ENVS = ["InvertedDoublePendulum-v5", "Hopper-v5", "Acrobot-v1"]
SEEDS = [101, 102, 103]
REPORT_SEEDS_FROM = 100  # seeds below it are tuning seeds (choices were made on them), from it reporting seeds
STEPS = 200_000
SIDES = ["frugal", "frugal-every", "sb3"]
#: Envs built by a factory rather than a Gymnasium id: name → (factory path, its kwargs). SB3's plain default for
#: MinAtar's 10×10 grids is its MlpPolicy: its CnnPolicy (NatureCNN) needs frames of at least 36×36.
FACTORIES: dict[str, tuple[str, dict[str, Any]]] = {
    "MinAtar-Breakout": (MINATAR, SUITE_ENVS["MinAtar-Breakout"]["env_kwargs"]),
    "MinAtar-SpaceInvaders": (MINATAR, {"game": "space_invaders"}),
    "MinAtar-Asterix": (MINATAR, {"game": "asterix"}),
    "MinAtar-Freeway": (MINATAR, {"game": "freeway"}),
    "MinAtar-Seaquest": (MINATAR, {"game": "seaquest"})}
EVERY_FP32 = ["--sync", "every", "--weights-codec", "fp32"]
#: The ``continuous`` fallback until 2026-12-02 (CleanRL ``ppo_continuous_action.py``'s settings), spelled out over
#: the family so that the ``continuous*`` sides keep the runs their cached rows are.
CLEANRL_CONT = ["--preset", "family:continuous", "--anneal-lr", "--norm-obs", "--norm-reward", "--no-norm-value"]
#: The ``continuous`` fallback since 2026-12-02, spelled out the same way: SB3's constant rate, observations
#: normalised, the critic's targets standardised.
OBS_VALUE_NORM = [*CLEANRL_CONT, "--no-anneal-lr", "--no-norm-reward", "--norm-value"]
#: PPO's continuous batch and update under IMPALA's loop (a candidate for IMPALA's continuous family).
IMPALA_CONT_PPO = ["--preset", "none", "--envs-per-worker", "1", "--num-steps", "1024", "--num-minibatches", "32",
                   "--update-epochs", "10", "--learning-rate", "3e-4", "--ent-coef", "0"]
#: Side → (algorithm, flags over the env, budget and seed).
EXTRA = {"frugal": ("ppo", []), "frugal-every": ("ppo", EVERY_FP32),
         "frugal-discrete": ("ppo", ["--preset", "family:discrete"]),
         "frugal-nopreset": ("ppo", ["--preset", "family:{family}"]),
         "frugal-nopreset-image": ("ppo", ["--preset", "family:image"]),
         "frugal-discrete-sb3": ("ppo", ["--preset", "family:discrete", "--envs-per-worker", "1", "--num-steps", "1024",
                                         "--num-minibatches", "32", "--update-epochs", "10", "--learning-rate", "3e-4",
                                         "--ent-coef", "0.0"]),
         "continuous": ("ppo", CLEANRL_CONT),
         "continuous-constant-lr": ("ppo", [*CLEANRL_CONT, "--no-anneal-lr"]),
         "continuous-raw-reward": ("ppo", [*CLEANRL_CONT, "--no-norm-reward"]),
         "continuous-sb3": ("ppo", [*CLEANRL_CONT, "--no-anneal-lr", "--no-norm-reward", "--no-norm-obs"]),
         "continuous-reward-only": ("ppo", [*CLEANRL_CONT, "--no-anneal-lr", "--no-norm-obs"]),
         # the critic's targets standardised instead of the rewards (Sample Factory's normalize_returns)
         "continuous-value-norm": ("ppo", [*CLEANRL_CONT, "--no-norm-reward", "--norm-value"]),
         "continuous-sb3-value-norm": ("ppo", [*CLEANRL_CONT, "--no-anneal-lr", "--no-norm-reward", "--no-norm-obs",
                                               "--norm-value"]),
         "continuous-obs-value-norm": ("ppo", OBS_VALUE_NORM),  # the fallback since
         # LunarLanderContinuous's gap taken apart: the fallback with every-update fp32 weights, and SB3's settings
         # with observations normalised alone
         "continuous-obs-value-norm-every": ("ppo", [*OBS_VALUE_NORM, *EVERY_FP32]),
         "continuous-sb3-obs": ("ppo", [*CLEANRL_CONT, "--no-anneal-lr", "--no-norm-reward"]),
         "impala": ("impala", []), "impala-every": ("impala", EVERY_FP32),
         # IMPALAConfig's own defaults, and two candidates for a continuous family (tuning seeds 1-3)
         "impala-base": ("impala", ["--preset", "none"]),
         "impala-ent0": ("impala", ["--preset", "none", "--ent-coef", "0"]),
         "impala-cont-ppo": ("impala", IMPALA_CONT_PPO),
         "impala-no-overlap": ("impala", [*IMPALA_CONT_PPO, "--no-overlap"]),  # the continuous family since it ran
         # the continuous family with V-trace's traces cut by λ = 0.95 (GAE's λ in PPO's fallback)
         "impala-lam95": ("impala", ["--correct", "vtrace:1:1:0.95"]),
         # the family with the critic fitted to standardised returns instead of scaled rewards (PPO's change of
         # 2026-12-02), with its annealed rate, or with a constant one as PPO's fallback since
         "impala-value-norm": ("impala", ["--no-norm-reward", "--norm-value"]),
         "impala-obs-value-norm": ("impala", ["--no-norm-reward", "--norm-value", "--no-anneal-lr"]),
         # HSA2C's fp32 pushes and pulls (its defaults until 2026-12-01) against bf16 both ways
         "hsa2c-fp32": ("hsa2c", ["--update-codec", "fp32", "--pull-codec", "fp32"]),
         "hsa2c-bf16": ("hsa2c", ["--update-codec", "bf16", "--pull-codec", "bf16"]),
         "hsa2c-bf16-push": ("hsa2c", ["--update-codec", "bf16+zstd", "--pull-codec", "fp32"]),
         "hsa2c": ("hsa2c", []),  # the defaults since
         "hsa2c-old": ("hsa2c", ["--update-codec", "fp32", "--pull-codec", "fp32", "--no-pull-delta"]),
         # float64 observations (MuJoCo's) as the float32 words the policy acts on (the default since), or as they are
         "frugal-obs-fp32": ("ppo", ["--uplink-obs", "fp32"]),
         "frugal-obs-exact": ("ppo", ["--uplink-obs", "exact"]),
         # 8 workers with the env's preset or family: its batch kept (the default since), or grown 4-fold (before)
         "frugal-w8": ("ppo", ["--workers", "8"]),
         "frugal-w8-grown": ("ppo", ["--workers", "8", "--num-steps", "{num_steps}"])}
#: Ratio key in the table → (label, our side, the reference side).
RATIOS = {"ratio": ("frugal / sb3", "frugal", "sb3"),
          "ratio_nopreset": ("frugal-nopreset / sb3", "frugal-nopreset", "sb3"),
          "ratio_every_frugal": ("frugal / frugal-every", "frugal", "frugal-every"),
          "ratio_every_impala": ("impala / impala-every", "impala", "impala-every"),
          "ratio_impala": ("impala / sb3", "impala", "sb3"),
          "ratio_impala_base": ("impala-base / sb3", "impala-base", "sb3"),
          "ratio_obs_fp32": ("frugal-obs-fp32 / frugal-obs-exact", "frugal-obs-fp32", "frugal-obs-exact"),
          "ratio_w8": ("frugal-w8 / frugal-w8-grown", "frugal-w8", "frugal-w8-grown"),
          "ratio_value_norm": ("continuous-value-norm / sb3", "continuous-value-norm", "sb3"),
          "ratio_obs_fp32_sb3": ("frugal-obs-fp32 / sb3", "frugal-obs-fp32", "sb3"),
          "ratio_fallback": ("continuous-obs-value-norm / sb3", "continuous-obs-value-norm", "sb3"),
          "ratio_sb3_settings": ("continuous-sb3 / sb3", "continuous-sb3", "sb3"),
          "ratio_sb3_value_norm": ("continuous-sb3-value-norm / sb3", "continuous-sb3-value-norm", "sb3"),
          "ratio_sb3_norm_obs": ("continuous-sb3-obs / sb3-norm-obs", "continuous-sb3-obs", "sb3-norm-obs"),
          "ratio_norm_obs_cost_sb3": ("sb3-norm-obs / sb3", "sb3-norm-obs", "sb3")}


def frugal_command(env: str, seed: int, steps: int, side: str) -> list[str]:
    """The CLI run of one frugalrl side: only the env, budget and seed change the training."""
    algo, flags = EXTRA[side]
    env_arg, kwargs = FACTORIES.get(env, (env, None))
    if any("{family}" in f for f in flags):
        from frugalrl.presets import env_family

        flags = [f.format(family=env_family(env_arg, kwargs)) for f in flags]
    if any("{num_steps}" in f for f in flags):  # the preset's or family's own
        from frugalrl.presets import make_config

        tuned = make_config(algo, env_arg, **({"env_kwargs": kwargs} if kwargs else {})).num_steps
        flags = [f.format(num_steps=tuned) for f in flags]
    if kwargs:
        flags = ["--env-kwargs", json.dumps(kwargs), *flags]
    return [sys.executable, "-m", "frugalrl.cli", "train", algo, "--env", env_arg, "--total-timesteps", str(steps),
            "--seed", str(seed), *flags, "--torch-threads", "1", "--run-dir", str(CACHE / "runs"),
            "--run-name", f"{side}-{env}-s{seed}", "--no-progress", "--no-tensorboard", "--no-plots"]


def run_frugal(env: str, seed: int, steps: int, side: str) -> dict[str, Any]:
    """One frugalrl run through the CLI, as a user starts it; its summary's figures."""
    cmd = frugal_command(env, seed, steps, side)
    shutil.rmtree(CACHE / "runs" / f"{side}-{env}-s{seed}", ignore_errors=True)  # frugalrl never writes over a run
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{side} {env} seed {seed} failed:\n{done.stderr[-3000:]}")
    run_dir = CACHE / "runs" / f"{side}-{env}-s{seed}"
    s = json.loads((run_dir / "summary.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    return {"return": s["eval_return_mean"], "return_std": s["eval_return_std"],
            "eval_episodes": s["eval_episodes"], "env_steps": s["env_steps"], "train_seconds": s["train_seconds"],
            "bytes": {k: v for k, v in s["bytes"].items() if isinstance(v, int) and v},
            "wall_seconds": time.monotonic() - t0, "preset": config["preset"], "sources": config["sources"],
            "settings_printed": [line for line in done.stderr.splitlines() if line.startswith(("frugalrl:", "  "))],
            "command": " ".join(cmd[1:])}


def run_sb3(env: str, seed: int, steps: int, side: str = "sb3") -> dict[str, Any]:
    """One SB3 run in a fresh interpreter (``--sb3-run``); ``sb3-norm-obs`` wraps its env in VecNormalize."""
    cmd = [sys.executable, __file__, "--sb3-run", env, "--seed", str(seed), "--steps", str(steps),
           *(["--sb3-norm-obs"] if side == "sb3-norm-obs" else [])]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"SB3 {env} seed {seed} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {**out, "wall_seconds": time.monotonic() - t0, "command": " ".join(cmd[1:])}


def _sb3_main(env: str, seed: int, steps: int, norm_obs: bool = False) -> None:
    """One SB3 run with its defaults (``norm_obs``: observations through ``VecNormalize(norm_reward=False)``,
    frozen for the evaluation); prints its result as one JSON line."""
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    from frugalrl.evaluation import EVAL_SEED

    torch.set_num_threads(1)
    if env in FACTORIES:
        from frugalrl.envs.spec import to_env_spec

        factory, kwargs = FACTORIES[env]
        env_id: Any = to_env_spec(factory, kwargs).make  # the env frugalrl's workers build
    else:
        env_id = env
    venv = make_vec_env(env_id, n_envs=1, seed=seed)
    if norm_obs:
        venv = VecNormalize(venv, norm_obs=True, norm_reward=False)
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu")
    t0 = time.monotonic()
    model.learn(total_timesteps=steps)
    train_seconds = time.monotonic() - t0
    eval_env = make_vec_env(env_id, n_envs=1, seed=EVAL_SEED + seed)
    if norm_obs:
        eval_env = VecNormalize(eval_env, training=False, norm_obs=True, norm_reward=False)
        eval_env.obs_rms = venv.obs_rms
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
    print(json.dumps({"return": float(mean), "return_std": float(std), "eval_episodes": EVAL_EPISODES,
                      "env_steps": int(model.num_timesteps), "train_seconds": train_seconds,
                      "sb3": stable_baselines3.__version__, "torch_threads": torch.get_num_threads()}))


def table(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per env and side: the returns by seed, their mean and median; per env, the :data:`RATIOS` whose sides ran
    common seeds at one budget, over those seeds only (:func:`learning_suite.return_ratio`: above 1 is better,
    negative returns included)."""
    out: dict[str, dict[str, Any]] = {}
    reported = {(r["env"], r["side"]) for r in runs.values() if r["seed"] >= REPORT_SEEDS_FROM}
    for r in runs.values():
        side = r["side"]
        if r["seed"] < REPORT_SEEDS_FROM and (r["env"], side) in reported:  # a side tuned and reported: two rows
            side += " (tuning seeds)"
        row = out.setdefault(r["env"], {}).setdefault(side, {"seeds": [], "returns": [], "steps": []})
        row["seeds"].append(r["seed"])
        row["returns"].append(round(r["return"], 1))
        row["steps"] = sorted({*row["steps"], r["steps"]})
    for sides in out.values():
        for row in sides.values():
            row["mean"] = round(statistics.fmean(row["returns"]), 1)
            row["median"] = round(statistics.median(row["returns"]), 1)
        present = [(key, spec) for key, spec in RATIOS.items() if spec[1] in sides and spec[2] in sides]
        for key, (label, ours, ref) in present:
            common = sorted(set(sides[ours]["seeds"]) & set(sides[ref]["seeds"]))  # a ratio compares the same seeds
            if not common or sides[ours]["steps"] != sides[ref]["steps"]:  # ... at the same budget
                continue
            pairs = [[ret for seed, ret in zip(sides[side]["seeds"], sides[side]["returns"], strict=True)
                      if seed in common] for side in (ours, ref)]
            sides[key] = {"label": label, "seeds": common,
                          **{name: round(return_ratio(f(pairs[0]), f(pairs[1])), 2)
                             for name, f in (("mean", statistics.fmean), ("median", statistics.median))}}
    return out


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    """The table of :func:`table` as Markdown."""
    lines = ["| env | side | returns by seed | mean | median |", "|---|---|---|---:|---:|"]
    for env, sides in rows.items():
        for side, row in sides.items():
            if not side.startswith("ratio"):
                shown = ", ".join(f"{s}: {v}" for s, v in zip(row["seeds"], row["returns"], strict=True))
                lines.append(f"| {env} | {side} | {shown} | {row['mean']} | {row['median']} |")
        for key in RATIOS:
            if key in sides:
                r = sides[key]
                on = "seeds " + ", ".join(map(str, r.get("seeds", [])))
                lines.append(f"| {env} | {r['label']} | {on} | {r['mean']} | {r['median']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=ENVS)
    p.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    p.add_argument("--sides", nargs="+", default=SIDES, choices=[*EXTRA, "sb3", "sb3-norm-obs"])
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--force", action="store_true", help="rerun runs that are cached")
    p.add_argument("--report", action="store_true", help="only rebuild the JSON and table from the cache")
    p.add_argument("--sb3-run", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--sb3-norm-obs", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sb3_run:
        _sb3_main(args.sb3_run, args.seed, args.steps, args.sb3_norm_obs)
        return 0
    CACHE.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for seed in args.seeds:  # seed by seed, so that a run cut short leaves every env with the same seeds
            for env in args.envs:
                for side in args.sides:  # both sides of a seed back to back
                    path = CACHE / f"{side}-{env}-s{seed}.json"
                    if path.exists() and not args.force:
                        continue
                    out = (run_sb3(env, seed, args.steps, side) if side.startswith("sb3")
                           else run_frugal(env, seed, args.steps, side))
                    out.update(env=env, side=side, seed=seed, steps=args.steps, date=time.strftime("%Y-%m-%d %H:%M"))
                    path.write_text(json.dumps(out, indent=1))
                    print(f"[{time.strftime('%H:%M:%S')}] {env} {side} seed {seed}: {out['return']:.1f} "
                          f"({out['wall_seconds']:.0f} s)", flush=True)
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(CACHE.glob("*.json"))}
    rows = table(runs)
    result = {
        "commit": measured_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "torch_threads": 1, "eval_episodes": EVAL_EPISODES, "deterministic": True,
        "command": "python benchmarks/family_defaults.py " + " ".join(a for a in sys.argv[1:] if a != "--report"),
        "table": rows, "runs": runs,
    }
    (RESULTS / "family_defaults.json").write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
