"""HSA2C's A2C against Stable-Baselines3's A2C with rl-baselines3-zoo's hyperparameters, at equal env steps.

    python benchmarks/a2c_reference.py                       # LunarLander-v3, 200k steps (rl-zoo's budget), 3 seeds
    python benchmarks/a2c_reference.py --steps 1000000 --seeds 1 --out a2c_reference_1m
    python benchmarks/a2c_reference.py --env MinAtar-Breakout --steps 2000000 --variants sb3-zoo hsa2c a3c --out x
    python benchmarks/a2c_reference.py --env ALE-Breakout --steps 500000 --variants sb3-zoo hsa2c --out y

The question is whether frugalrl's A2C learns as much per env step as a reference library. Variants, every one
run for ``--steps`` env steps and scored by frugalrl's evaluation protocol (10 episodes on envs seeded
``EVAL_SEED + seed + i``, greedy / deterministic and sampled, each cut at the env's ``eval_max_steps``):

- ``sb3-zoo``: ``stable_baselines3.A2C`` with rl-zoo's entry for the env (``ENVS`` below). LunarLander: its
  ``LunarLander-v2`` entry (8 envs, 5-step rollouts, γ 0.995, linear learning rate from 8.3e-4, entropy 1e-5; SB3's
  defaults otherwise: RMSprop with α 0.99, ε 1e-5, gradient norm 0.5, value coefficient 0.5, separate 64-64 tanh
  networks, orthogonal init); CartPole, Acrobot and MountainCar: theirs (8 envs, entropy 0; 16 envs, entropy 0,
  VecNormalize of observations and rewards, its statistics frozen for the evaluation); Pendulum: its ``Pendulum``
  entry (8 envs, 8-step rollouts, GAE λ 0.9, value coefficient 0.4, linear rate from 7e-4, no advantage
  normalisation, gSDE with log std −2, no orthogonal init, VecNormalize). Pixels: its ``atari`` entry (16 envs, 5-step rollouts, entropy 0.01, value coefficient
  0.25, TF-like RMSprop with ε 1e-5, learning rate 7e-4; on ALE its ``AtariWrapper``'s training signal: a lost life
  ends the learner's episode, FIRE starts each life, rewards are clipped to their sign) with the same
  network as frugalrl's (ALE: the Nature-CNN, SB3's ``CnnPolicy``; MinAtar: the MinAtar paper's CNN, as a features
  extractor of SB3's, ``_sb3.grid_extractor``). The env is frugalrl's (ALE: ``make_atari``, sticky
  actions), so both libraries see the same game. Both are evaluated on the whole game (every life); on ALE SB3's
  policy plays it with automatic FIRE at the start and after each lost life (``AutoFire``), as it trained (its
  scores on the plain game are kept in each run's ``plain_game``: it never learned to serve), while frugalrl's
  trained without it and plays without it;
- ``a2c-zoo`` (LunarLander only): frugalrl's A2C (:class:`~frugalrl.algos.hsa2c.A2CProblem`) with the same
  settings, as one DPSGD worker with one process, B = 1 and Alg. 1's plain master step (ρ = 1, no momentum, no
  averaging, no reward or observation scaling), and ``vf_coef`` 1 (frugalrl's value loss is ½ MSE, SB3's MSE): the same algorithm
  as SB3's (``tests/test_a2c_sb3_replay.py`` checks the update is SB3's, weight for weight), so the two differ only
  by their random draws;
- ``hsa2c`` and ``a3c``: 2 workers with HSA2C's defaults (the env's ``hsa2c_vs_sync`` settings), B = 10 and B = 1
  (DDRL A3C), so a gap between these and ``sb3-zoo`` is what frugalrl's defaults cost or gain. Their rows also give
  the bytes on the wire;
- ``random``: uniform random actions on the same evaluation episodes, no training: the floor to read the others by.

Results: ``benchmarks/results/<out>.json`` and ``.md`` (``--out``, default ``a2c_reference``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
from _sb3 import evaluate_sb3, grid_extractor
from dpsgd_speedup import RESULTS, _fmt, hsa2c_run, save_results, timed_hsa2c
from hsa2c_vs_sync import ENVS as TIMED_ENVS
from learning_suite import sample_std

from frugalrl.envs.spec import to_env_spec

ZOO: dict[str, Any] = {  # rl-baselines3-zoo hyperparams/a2c.yml, LunarLander-v2 (n_timesteps 2e5)
    "n_envs": 8, "gamma": 0.995, "n_steps": 5, "learning_rate": "lin_0.00083", "ent_coef": 0.00001,
}
ZOO_ATARI: dict[str, Any] = {  # rl-baselines3-zoo hyperparams/a2c.yml, atari (frame_stack 4, AtariWrapper)
    "n_envs": 16, "ent_coef": 0.01, "vf_coef": 0.25,
}
ZOO_PENDULUM: dict[str, Any] = {  # rl-baselines3-zoo hyperparams/a2c.yml, Pendulum ("almost tuned", 1e6 steps)
    "normalize": True, "n_envs": 8, "ent_coef": 0.0, "max_grad_norm": 0.5, "n_steps": 8, "gae_lambda": 0.9,
    "vf_coef": 0.4, "gamma": 0.99, "use_rms_prop": True, "normalize_advantage": False, "learning_rate": "lin_7e-4",
    "use_sde": True, "policy_kwargs": {"log_std_init": -2, "ortho_init": False},
}
ZOO_LUNAR_CONTINUOUS: dict[str, Any] = {**ZOO_PENDULUM, "n_envs": 4}
"""rl-baselines3-zoo hyperparams/a2c.yml, LunarLanderContinuous ("tuned", 5e6 steps): Pendulum's with 4 envs."""
ZOO_MOUNTAINCAR_CONTINUOUS: dict[str, Any] = {  # rl-baselines3-zoo hyperparams/a2c.yml ("tuned", 1e5 steps)
    "normalize": True, "n_envs": 4, "n_steps": 100, "ent_coef": 0.0, "use_sde": True, "sde_sample_freq": 16,
    "policy_kwargs": {"log_std_init": 0.0, "ortho_init": False},
}
ZOO_BULLET: dict[str, Any] = {  # rl-baselines3-zoo hyperparams/a2c.yml, HopperBulletEnv-v0 (the pybullet defaults, 2e6
    # steps; the zoo's A2C file has no entry for gymnasium's MuJoCo Hopper, and SB3-zoo's Bullet entries run without
    # its TimeFeatureWrapper here)
    **{k: v for k, v in ZOO_PENDULUM.items() if k != "learning_rate"}, "n_envs": 4, "learning_rate": "lin_0.00096",
}
ZOO_REACHER: dict[str, Any] = {**ZOO_BULLET, "learning_rate": "lin_0.0008"}
"""rl-baselines3-zoo hyperparams/a2c.yml, ReacherBulletEnv-v0 ("tuned but unstable"): the pybullet defaults, lin_8e-4."""
ZOO_BIPEDAL: dict[str, Any] = {**ZOO_BULLET, "n_envs": 16}
"""rl-baselines3-zoo hyperparams/a2c.yml, BipedalWalker-v3 ("tuned", 5e6 steps): the pybullet defaults with 16 envs."""
ENVS: dict[str, dict[str, Any]] = {
    # env factory and kwargs, rl-zoo's entry, SB3's policy, the evaluation's step cap
    "LunarLander-v3": {"zoo": ZOO, "policy": "mlp", "eval_max_steps": 1000},
    "CartPole-v1": {"zoo": {"n_envs": 8, "ent_coef": 0.0}, "policy": "mlp", "eval_max_steps": 500},
    "Acrobot-v1": {"zoo": {"normalize": True, "n_envs": 16, "ent_coef": 0.0}, "policy": "mlp", "eval_max_steps": 500},
    "MountainCar-v0": {"zoo": {"normalize": True, "n_envs": 16, "ent_coef": 0.0}, "policy": "mlp", "eval_max_steps": 200},
    "Pendulum-v1": {"zoo": ZOO_PENDULUM, "policy": "mlp", "eval_max_steps": 200},
    "LunarLanderContinuous-v3": {"zoo": ZOO_LUNAR_CONTINUOUS, "policy": "mlp", "eval_max_steps": 1000},
    "Hopper-v5": {"zoo": ZOO_BULLET, "policy": "mlp", "eval_max_steps": 1000},
    "HalfCheetah-v5": {"zoo": ZOO_BULLET, "policy": "mlp", "eval_max_steps": 1000},  # the pybullet defaults are its entry
    "Walker2d-v5": {"zoo": ZOO_BULLET, "policy": "mlp", "eval_max_steps": 1000},
    "MountainCarContinuous-v0": {"zoo": ZOO_MOUNTAINCAR_CONTINUOUS, "policy": "mlp", "eval_max_steps": 999},
    "Reacher-v5": {"zoo": ZOO_REACHER, "policy": "mlp", "eval_max_steps": 50},
    "BipedalWalker-v3": {"zoo": ZOO_BIPEDAL, "policy": "mlp", "eval_max_steps": 1600},
    # discrete observations (one-hot, frugalrl.envs.spec.flat_observations); rl-zoo has no A2C entry: SB3's defaults
    "FrozenLake-v1": {"zoo": {"n_envs": 8}, "policy": "mlp", "eval_max_steps": 100},
    "Taxi-v4": {"zoo": {"n_envs": 8}, "policy": "mlp", "eval_max_steps": 200},
    "MinAtar-Breakout": {"env": TIMED_ENVS["MinAtar-Breakout"]["env"],
                         "env_kwargs": TIMED_ENVS["MinAtar-Breakout"]["settings"]["env_kwargs"],
                         "zoo": ZOO_ATARI, "policy": "grid", "eval_max_steps": 10_000},  # MinAtar's own cap
    **{f"MinAtar-{title}": {"env": TIMED_ENVS["MinAtar-Breakout"]["env"], "env_kwargs": {"game": game},
                            "zoo": ZOO_ATARI, "policy": "grid", "eval_max_steps": 10_000}
       for game, title in (("asterix", "Asterix"), ("freeway", "Freeway"), ("seaquest", "Seaquest"),
                           ("space_invaders", "SpaceInvaders"))},  # the other four games: nothing tuned for them
    # 4500 steps of 4 frames: the 5 minutes of play that Mnih et al. (2015) capped an evaluation episode at
    "ALE-Breakout": {"env": "frugalrl.envs.atari:make_atari", "env_kwargs": {"env_id": "ALE/Breakout-v5"},
                     "zoo": ZOO_ATARI, "policy": "cnn", "eval_max_steps": 4500},
}
VARIANTS = ("sb3-zoo", "a2c-zoo", "hsa2c", "a3c", "random")


def env_of(name: str) -> tuple[str, dict[str, Any]]:
    """The env factory (or Gymnasium id) and kwargs of the ``ENVS`` entry ``name``."""
    spec = ENVS[name]
    return spec.get("env", name), dict(spec.get("env_kwargs", {}))


def atari_training_wrappers(env: Any) -> Any:
    """What SB3's ``AtariWrapper`` (rl-zoo's ``env_wrapper``) does to training beyond frugalrl's preprocessing (no-op
    starts, frame skip with max-pooling and 84×84 frames are ``make_atari``'s already): a lost life ends the episode
    for the learner, FIRE starts every life, rewards are clipped to their sign. Evaluation plays the plain game."""
    from stable_baselines3.common.atari_wrappers import ClipRewardEnv, EpisodicLifeEnv, FireResetEnv

    env = EpisodicLifeEnv(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireResetEnv(env)
    return ClipRewardEnv(env)


class AutoFire(gym.Wrapper):
    """Presses FIRE when the game starts and after every lost life, so that a policy trained with ``AtariWrapper``'s
    automatic FIRE (which never had to serve) plays the whole game as it learned to. The FIRE steps are the
    wrapper's, not the policy's; their rewards count."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        obs, _, _, _, info = self.env.step(1)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, term, trunc, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        if lives < self.lives and not (term or trunc):
            obs, more, term, trunc, info = self.env.step(1)
            reward = float(reward) + float(more)
        self.lives = lives
        return obs, float(reward), term, trunc, info


def sb3_run(env: str, seed: int, steps: int) -> dict[str, Any]:
    """SB3's A2C with rl-zoo's entry for ``env``; its final deterministic and sampled returns on frugalrl's
    evaluation episodes."""
    import stable_baselines3
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
    from stable_baselines3.common.vec_env import VecNormalize

    t_start = time.monotonic()  # the same clock as frugal_run's wall_s: from building the envs to the trained model
    spec = ENVS[env]
    hp = dict(spec["zoo"])
    env_spec = to_env_spec(*env_of(env))
    pixels = spec["policy"] != "mlp"
    normalize = hp.pop("normalize", False)
    venv = make_vec_env(env_spec.make, n_envs=hp.pop("n_envs"), seed=seed,
                        wrapper_class=atari_training_wrappers if spec["policy"] == "cnn" else None)
    if normalize:  # rl-zoo's `normalize: true`: observations and rewards, frozen statistics at evaluation
        venv = VecNormalize(venv, gamma=hp.get("gamma", 0.99))
    if isinstance(hp.get("learning_rate"), str):  # "lin_<start>": linear to 0
        start = float(hp.pop("learning_rate")[4:])
        hp["learning_rate"] = lambda progress: progress * start
    policy, kwargs = "MlpPolicy", dict(hp.pop("policy_kwargs", {}))
    if pixels:
        kwargs = {"optimizer_class": RMSpropTFLike, "optimizer_kwargs": {"eps": 1e-5}}
        if spec["policy"] == "cnn":
            policy = "CnnPolicy"
        else:
            kwargs.update(features_extractor_class=grid_extractor(), net_arch=[], normalize_images=False)
    model = A2C(policy, venv, seed=seed, device="cpu", policy_kwargs=kwargs or None, **hp)
    t0 = time.monotonic()
    model.learn(total_timesteps=steps)
    train_s = time.monotonic() - t0
    wall_s = time.monotonic() - t_start
    cap = spec["eval_max_steps"]
    vecnorm = venv if normalize else None
    out: dict[str, Any] = {}
    if spec["policy"] == "cnn":  # scored as it trained, with automatic FIRE; the plain game's scores kept beside
        out["plain_game"] = {"final_eval_return": evaluate_sb3(model, env_spec, seed, True, vecnorm, cap)[0],
                             "stochastic_return": evaluate_sb3(model, env_spec, seed, False, vecnorm, cap)[0]}
    wrapper = AutoFire if spec["policy"] == "cnn" else None
    final, final_std = evaluate_sb3(model, env_spec, seed, True, vecnorm, cap, wrapper)
    stochastic, _ = evaluate_sb3(model, env_spec, seed, False, vecnorm, cap, wrapper)
    return {"seed": seed, "final_eval_return": final, "final_eval_std": final_std, "stochastic_return": stochastic,
            "env_steps": int(model.num_timesteps), "train_s": train_s, "wall_s": wall_s, "sb3": stable_baselines3.__version__,
            "eval_wrapper": None if wrapper is None else wrapper.__name__, **out}


class UniformPolicy:
    """Uniform random actions, answering SB3's ``predict``: the floor every learner's return is read against."""

    def __init__(self, space: Any, seed: int) -> None:
        self.space = space
        self.space.seed(seed)

    def predict(self, obs: Any, deterministic: bool = False) -> tuple[Any, None]:
        return self.space.sample(), None


def random_run(env: str, seed: int) -> dict[str, Any]:
    """Uniform random actions on the evaluation episodes the learners are scored on (no training)."""
    env_spec = to_env_spec(*env_of(env))
    probe = env_spec.make()
    space = probe.action_space
    probe.close()
    final, final_std = evaluate_sb3(UniformPolicy(space, seed), env_spec, seed, False, None,
                                    ENVS[env]["eval_max_steps"])
    return {"seed": seed, "final_eval_return": final, "final_eval_std": final_std, "stochastic_return": final,
            "env_steps": 0, "train_s": 0.0}


def frugal_run(env: str, variant: str, seed: int, steps: int, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """frugalrl's A2C as ``variant``; its final greedy and sampled returns on the same evaluation episodes."""
    spec = ENVS[env]
    name, env_kwargs = env_of(env)
    common = {"total_timesteps": steps, "seed": seed, "eval_max_steps": spec["eval_max_steps"]}
    if variant == "a2c-zoo":
        if env != "LunarLander-v3":
            raise SystemExit("a2c-zoo replays rl-zoo's LunarLander entry only (--env LunarLander-v3)")
        cfg = timed_hsa2c(name, 3600.0, 1e9, 1, workers=1, processes=1, local_steps=1, rho=1.0, momentum=0.0,
                          average=0.0, norm_reward=False, norm_obs=False, envs_per_process=ZOO["n_envs"], num_steps=ZOO["n_steps"],
                          gamma=ZOO["gamma"], ent_coef=ZOO["ent_coef"], eta=float(ZOO["learning_rate"][4:]),
                          eta_anneal=1.0, vf_coef=1.0, **common)  # ½ MSE × 1 = SB3's MSE × 0.5
    else:
        timed = TIMED_ENVS.get(env, {}).get("settings", {})
        cfg = timed_hsa2c(name, 36_000.0, 1e9, 1, workers=2, processes=1, local_steps=10 if variant == "hsa2c" else 1,
                          **{**timed, "env_kwargs": env_kwargs}, **common)
    cfg = replace(cfg, deferred_eval=False, eval_every=10**9, eval_every_s=None, **(settings or {}))
    t0 = time.monotonic()
    rec = hsa2c_run(cfg, 0.0)
    return {"seed": seed, "final_eval_return": rec["final_eval_return"], "stochastic_return": rec["stochastic_return"],
            "env_steps": rec["env_steps"], "train_s": rec["env_steps"] / rec["env_steps_per_s"],
            "wall_s": time.monotonic() - t0, "bytes_total": rec["bytes_total"],
            "config": {k: getattr(cfg, k) for k in ("workers", "local_steps", "rho", "momentum", "average",
                                                     "norm_reward", "norm_obs", "envs_per_process", "num_steps", "gamma", "ent_coef",
                                                     "eta", "eta_anneal", "max_grad_norm", "vf_coef", "hidden",
                                                     "net")}}


def _row(variant: str, rs: list[dict[str, Any]]) -> dict[str, Any]:
    finals = [r["final_eval_return"] for r in rs]
    sampled = [r.get("stochastic_return") for r in rs]
    row = {"variant": variant, "finals": finals, "mean": float(np.mean(finals)), "std": sample_std(finals),
           "train_s_mean": float(np.mean([r["train_s"] for r in rs])), "runs": rs}
    if all("wall_s" in r for r in rs):
        row["wall_s_mean"] = float(np.mean([r["wall_s"] for r in rs]))
    if all(x is not None for x in sampled):
        row.update(stochastic=sampled, stochastic_mean=float(np.mean(sampled)), stochastic_std=sample_std(sampled))
    if all("bytes_total" in r for r in rs):
        row["mb_mean"] = float(np.mean([r["bytes_total"] for r in rs])) / 1e6
    return row


def markdown(rows: list[dict[str, Any]], steps: int) -> str:
    """One line per variant."""
    lines = [f"| variant | final return at {steps:,} env steps, greedy (mean ± std) | per seed | sampled actions "
             "(mean ± std) | MB on the wire | train s (mean) |", "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        sampled = (f"{r['stochastic_mean']:.1f} ± {r['stochastic_std']:.1f}" if "stochastic_mean" in r else "—")
        lines.append(f"| {r['variant']} | {r['mean']:.1f} ± {r['std']:.1f} | "
                     f"{' '.join(f'{x:.1f}' if max(map(abs, r['finals'])) < 20 else f'{x:.0f}' for x in r['finals'])} | {sampled} | {_fmt(r.get('mb_mean'))} | "
                     f"{_fmt(r['train_s_mean'] or None)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="LunarLander-v3", choices=list(ENVS))
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--settings", default="{}", help="JSON of HSA2CConfig fields over every frugalrl variant")
    ap.add_argument("--out", default="a2c_reference")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of <out>.json of the variants not run now (e.g. to rerun only the reference)")
    args = ap.parse_args(argv)
    started = time.time()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    kept: dict[str, dict[str, Any]] = {}
    if args.merge:
        old = json.loads((RESULTS / f"{args.out}.json").read_text())
        if old["env"] != args.env or old["steps"] != args.steps:
            raise SystemExit(f"--merge: {args.out}.json ran {old['env']} for {old['steps']} steps")
        kept = {r["variant"]: {**r, "from_run": old["command"]} for r in old["rows"] if r["variant"] not in runs}
    settings = json.loads(args.settings)
    for seed in args.seeds:  # seed-major: the variants of one seed back to back
        for v in args.variants:
            if v == "sb3-zoo":
                r = sb3_run(args.env, seed, args.steps)
            elif v == "random":
                r = random_run(args.env, seed)
            else:
                r = frugal_run(args.env, v, seed, args.steps, settings)
            runs[v].append(r)
            print(f"  {v} seed {seed}: final {r['final_eval_return']:.1f} (sampled {_fmt(r['stochastic_return'])}) "
                  f"after {r['env_steps']} steps, {_fmt(r['train_s'])} s", flush=True)
    rows = [kept.get(v) or _row(v, runs[v]) for v in VARIANTS if v in runs or v in kept]
    md = markdown(rows, args.steps)
    zoo = ENVS[args.env]["zoo"]
    save_results(args.out, f"A2C against SB3 A2C (rl-zoo) on {args.env}",
                 {"env": args.env, "env_spec": env_of(args.env), "steps": args.steps, "zoo": zoo,
                  "eval_max_steps": ENVS[args.env]["eval_max_steps"], "rows": rows}, md, started)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
