"""Benchmark: the experience uplink (issue "The experience uplink: the bytes AAPS left behind").

Three parts:

1. **LunarLander-v3 training runs** (PPO, the settings of ``make demo``: 2 workers × 8 envs, 128-step
   rollouts, local backend), ``--seeds`` seeds each, through the CLI in a fresh interpreter, for each
   setting of :data:`SETTINGS`: every-update sync with raw fp32 experience, AAPS (δ 0.05) with raw
   experience, AAPS with the default lossless uplink (``--uplink auto``: log-probabilities for the
   behaviour, byte-plane shuffle + zstd), and AAPS with lossy int8 observations on top. Bytes per env step by
   kind (what the byte meter counted, ``summary.json``) and the final 10-episode evaluation return.
2. **Codec CPU time** on recorded rollouts: a worker (:class:`~frugalrl.envs.worker.EnvWorker`, in this
   process) runs the policy of the first AAPS raw run for ``--rollouts`` rollouts; each reply is encoded (the
   worker's side) and decoded (the learner's side) under each uplink option, timed per env step; lossless
   options are checked bit for bit, lossy ones report their largest observation error.
3. **ALE** (``--ale``): PPO on Pong (``frugalrl.envs.atari:make_atari``, 4×84×84 uint8 frame stacks) at a
   fixed step budget with ``--uplink none`` and ``auto``: observation bytes per env step and steps/s.

    python benchmarks/uplink.py --steps 1000000 --seeds 1 2 3 --ale     # ~1 h on 2 cores
    python benchmarks/uplink.py --steps 100000 --seeds 1 --settings raw auto

Writes benchmarks/results/uplink.json and benchmarks/results/uplink.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from frugalrl.wire.message import Message, decode_message, encode_message
from frugalrl.wire.meter import KINDS
from frugalrl.wire.uplink import UplinkCodecs, UplinkOptions

RESULTS = Path(__file__).parent / "results"
DEMO_FLAGS = ["--env", "LunarLander-v3", "--workers", "2", "--envs-per-worker", "8", "--num-steps", "128",
              "--num-minibatches", "32", "--update-epochs", "4", "--learning-rate", "5e-4", "--gamma", "0.999",
              "--gae-lambda", "0.98", "--ent-coef", "0.01", "--sync", "aaps", "--kl-threshold", "0.05",
              "--eval-every", "20", "--backend", "local", "--weights-codec", "fp32"]


#: Name → (label, extra CLI flags over DEMO_FLAGS).
SETTINGS: dict[str, tuple[str, list[str]]] = {
    "every": ("every-update, raw fp32", ["--sync", "every", "--uplink", "none", "--uplink-behaviour", "params"]),
    "raw": ("AAPS, raw fp32", ["--uplink", "none", "--uplink-behaviour", "params"]),
    "auto": ("AAPS + lossless (auto: log-prob + zstd)", ["--uplink", "auto"]),
    "int8": ("AAPS + lossless + int8 observations", ["--uplink", "auto", "--uplink-obs", "int8"]),
}
#: Uplink options of the codec timing: name → (options, behaviour stream of the recorded replies).
TIMED: dict[str, UplinkOptions] = {
    "none (params)": UplinkOptions("none", behaviour="params"),
    "none": UplinkOptions("none"),
    "lz4": UplinkOptions("lz4"),
    "zstd": UplinkOptions("zstd"),
    "auto": UplinkOptions("auto"),
    "auto + bf16 obs": UplinkOptions("auto", obs="bf16"),
    "auto + int8 obs": UplinkOptions("auto", obs="int8"),
}


def train(setting: str, steps: int, seed: int, run_dir: Path, force: bool, env_flags: list[str] = DEMO_FLAGS,
          tag: str = "LunarLander-v3") -> tuple[dict[str, Any], list[str]]:
    """The summary of a ``frugalrl train ppo`` run of ``SETTINGS[setting]`` (cached in ``run_dir``)."""
    name = f"{tag}-uplink-{setting}-t{steps}-s{seed}"
    command = ["frugalrl", "train", "ppo", *env_flags, *SETTINGS[setting][1], "--total-timesteps", str(steps),
               "--seed", str(seed), "--run-dir", str(run_dir), "--run-name", name, "--no-progress",
               "--no-tensorboard", "--no-plots"]
    summary_path = run_dir / name / "summary.json"
    if force or not summary_path.exists():
        shutil.rmtree(run_dir / name, ignore_errors=True)  # a rerun's: frugalrl never writes over a run
        print(f"[{time.strftime('%H:%M:%S')}] {' '.join(command)}", flush=True)
        subprocess.run([sys.executable, "-m", "frugalrl.cli", *command[1:]], check=True, stdout=subprocess.DEVNULL)
    return json.loads(summary_path.read_text()), command


def per_step(summary: dict[str, Any]) -> dict[str, float]:
    """Bytes per env step by kind (and in all, and worker → head only)."""
    b, n = summary["bytes"], summary["env_steps"]
    out = {k: round(b.get(k, 0) / n, 3) for k in KINDS if b.get(k, 0)}
    out["total"] = round(b["total"] / n, 3)
    out["uplink_total"] = round(sum(b["up"].values()) / n, 3)
    return out


def record_rollouts(run_dir: Path, count: int, seed: int) -> dict[str, list[Message]]:
    """``count`` rollout replies (2 workers' worth of 8 envs, 128 steps) of a trained policy, as a worker makes
    them, once per behaviour stream (same seed: the same steps; raw: the options are applied to copies)."""
    from frugalrl.algos import load_policy
    from frugalrl.envs.spec import to_env_spec
    from frugalrl.envs.worker import EnvWorker
    from frugalrl.wire.message import encode_state_dict

    agent, _ = load_policy(run_dir)
    weights = encode_state_dict(agent.state_dict(), "fp32", getattr(agent, "exact_tensors", ()))
    weights.meta = {"version": 0, "spec": agent.spec.to_json()}
    out: dict[str, list[Message]] = {}
    for behaviour in ("params", "logprob"):
        replies = out.setdefault(behaviour, [])
        for w in range(2):
            worker = EnvWorker(w, to_env_spec("LunarLander-v3", None), 8, first_env=8 * w, seed=seed,
                               uplink=UplinkOptions("none", behaviour=behaviour))  # type: ignore[arg-type]
            worker.handle(Message("reset", {"seed": seed}))
            assert worker.handle(weights).op == "ok"
            for _ in range(count // 2):
                reply = worker.handle(Message("rollout", {"num_steps": 128}))
                assert reply.op == "rollout", reply.meta
                replies.append(reply)
            worker.close()
    return out


def time_codecs(replies: dict[str, list[Message]], repeats: int) -> dict[str, Any]:
    """Per uplink option of :data:`TIMED`: bytes per env step by kind, encode and decode µs per env step (best of
    ``repeats``); lossless options checked bit for bit, lossy ones measured (largest observation error, also in
    units of each feature's standard deviation)."""
    out: dict[str, Any] = {}
    steps = sum(r.arrays["rewards"].size for r in replies["params"])
    for label, options in TIMED.items():
        source = replies[options.behaviour]
        picker = UplinkCodecs(options)
        msgs = [Message(r.op, r.meta, r.arrays, picker.codecs(r.arrays)) for r in source]
        enc, dec = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            blobs = [encode_message(m) for m in msgs]
            enc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            decoded = [decode_message(b)[0] for b, _ in blobs]
            dec.append(time.perf_counter() - t0)
        obs_err = 0.0
        obs_err_std = 0.0
        for m, d in zip(msgs, decoded, strict=True):
            for name, x in m.arrays.items():
                y = d.arrays[name]
                assert y.dtype == x.dtype and y.shape == x.shape, (label, name)
                if options.obs != "exact" and name in ("obs", "next_obs", "final_obs"):
                    err = np.abs(y.astype(np.float64) - x)
                    obs_err = max(obs_err, float(err.max(initial=0.0)))
                    std = x.reshape(-1, x.shape[-1]).std(axis=0) + 1e-8
                    obs_err_std = max(obs_err_std, float((err.reshape(-1, x.shape[-1]) / std).max(initial=0.0)))
                else:
                    assert y.tobytes() == x.tobytes(), (label, name)
        sizes: dict[str, int] = {}
        for _, sz in blobs:
            for k, v in sz.items():
                sizes[k] = sizes.get(k, 0) + v
        out[label] = {
            "options": options.to_json(),
            "bytes_per_step": {k: round(v / steps, 3) for k, v in sizes.items()},
            "total_per_step": round(sum(sizes.values()) / steps, 3),
            "encode_us_per_step": round(min(enc) / steps * 1e6, 4),
            "decode_us_per_step": round(min(dec) / steps * 1e6, 4),
            "codecs": msgs[-1].codecs,
            "obs_max_abs_error": obs_err,
            "obs_max_error_in_std": round(obs_err_std, 5),
        }
    return {"env_steps": steps, "messages": len(replies["params"]), "options": out}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean (and spread) of a setting's runs: bytes per step by kind, returns, steps/s."""
    kinds = sorted({k for r in runs for k in r["bytes_per_step"]})
    rets = [r["eval_return_mean"] for r in runs]
    return {
        "seeds": [r["seed"] for r in runs],
        "bytes_per_step": {k: round(float(np.mean([r["bytes_per_step"].get(k, 0.0) for r in runs])), 3)
                           for k in kinds},
        "eval_returns": rets,
        "eval_return_mean": round(float(np.mean(rets)), 2),
        "eval_return_std": round(float(np.std(rets, ddof=1)) if len(rets) > 1 else 0.0, 2),
        "steps_per_second": round(float(np.mean([r["steps_per_second"] for r in runs])), 1),
        "weight_syncs": [r["weight_syncs"] for r in runs],
    }


ALE_FLAGS = ["--env", "frugalrl.envs.atari:make_atari", "--env-kwargs", '{"env_id": "ALE/Pong-v5"}', "--workers", "2",
             "--envs-per-worker", "4", "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "2",
             "--sync", "aaps", "--eval-episodes", "0", "--backend", "local", "--weights-codec", "fp32"]


def markdown(result: dict[str, Any]) -> str:
    settings, micro = result["settings"], result["codec_time"]["options"]
    kinds = [k for k in (*KINDS, "total") if any(k in r["bytes_per_step"] for r in settings.values())]
    lines = [
        "# The experience uplink: LunarLander-v3, PPO (the settings of `make demo`)",
        "",
        f"{result['steps']:,} env steps per run, seeds {result['seeds']}; 2 workers × 8 envs, 128-step rollouts, "
        "local backend. Bytes per env step by kind as the byte meter counted them (`summary.json`), mean over the "
        "seeds; `uplink`: worker → head only. Return: final 10-episode greedy evaluation of each seed.",
        "",
        "| setting | " + " | ".join(kinds) + " | uplink | returns (per seed) | mean return | steps/s |",
        "|---|" + "---:|" * (len(kinds) + 1) + "---|---:|---:|",
    ]
    for key, r in settings.items():
        b = r["bytes_per_step"]
        lines.append(f"| {SETTINGS[key][0]} | " + " | ".join(f"{b.get(k, 0):.2f}" for k in kinds)
                     + f" | {b.get('uplink_total', 0):.2f} | {' / '.join(f'{x:.1f}' for x in r['eval_returns'])}"
                     f" | {r['eval_return_mean']:.1f} ± {r['eval_return_std']:.1f} | {r['steps_per_second']:.0f} |")
    if "targets" in result:
        lines += ["", "Targets: " + "; ".join(f"{k}: {v}" for k, v in result["targets"].items())]
    lines += ["", "## Codec CPU time on recorded rollouts", "",
              f"{result['codec_time']['messages']} rollout replies of a trained policy "
              f"({result['codec_time']['env_steps']:,} env steps), whole messages encoded (worker) and decoded "
              f"(learner) in one thread, best of {result['codec_time']['repeats']}; lossless options checked bit for "
              "bit. Observation error: largest absolute error, and in units of the feature's standard deviation.",
              "",
              "| uplink | bytes / step | encode µs / step | decode µs / step | obs error (abs / std) | codecs |",
              "|---|---:|---:|---:|---|---|"]
    for u, r in micro.items():
        codecs = ", ".join(f"{k} {v}" for k, v in r["codecs"].items()) or "raw"
        err = "exact" if r["options"]["obs"] == "exact" else f"{r['obs_max_abs_error']:.2g} / {r['obs_max_error_in_std']:.2g}"
        lines.append(f"| {u} | {r['total_per_step']:.2f} | {r['encode_us_per_step']:.3f} | "
                     f"{r['decode_us_per_step']:.3f} | {err} | {codecs} |")
    if "ale" in result:
        lines += ["", "## ALE Pong, 4×84×84 uint8 frame stacks", "",
                  f"PPO (Nature CNN, AAPS), {result['ale']['steps']:,} env steps, 2 workers × 4 envs, seed 1.", "",
                  "| uplink | observations B / step | total B / step | steps/s | obs codecs |", "|---|---:|---:|---:|---|"]
        for u, r in result["ale"]["runs"].items():
            lines.append(f"| {u} | {r['bytes_per_step'].get('observations', 0):.1f} | "
                         f"{r['bytes_per_step']['total']:.1f} | {r['steps_per_second']:.0f} | {r['obs_codecs']} |")
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def run_record(s: dict[str, Any], command: list[str], seed: int) -> dict[str, Any]:
    """What the table keeps of one run's summary."""
    return {"seed": seed, "bytes_per_step": per_step(s),
            "bytes": {k: v for k, v in s["bytes"].items() if k not in ("per_worker",)},
            "eval_return_mean": s["eval_return_mean"], "eval_return_std": s["eval_return_std"],
            "env_steps": s["env_steps"], "steps_per_second": s["steps_per_second"],
            "weight_syncs": s["weight_syncs"]["total"], "uplink": (s.get("details") or {}).get("uplink"),
            "run_dir": s["run_dir"], "command": " ".join(command)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--every-seeds", type=int, default=1, help="seeds of the every-update run (bytes: weights)")
    p.add_argument("--rollouts", type=int, default=20, help="rollout replies recorded for the codec timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ale", action="store_true", help="also the ALE Pong runs")
    p.add_argument("--ale-steps", type=int, default=20_480)
    p.add_argument("--force", action="store_true", help="retrain even if the run directories exist")
    args = p.parse_args()
    torch.set_num_threads(1)
    run_dir = RESULTS / "runs"
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in args.seeds:  # seed-major: each seed's settings run back to back (the same machine load)
        for key in args.settings:
            if key == "every" and len(runs.get(key, [])) >= args.every_seeds:
                continue
            s, command = train(key, args.steps, seed, run_dir, args.force)
            runs.setdefault(key, []).append(run_record(s, command, seed))
    settings = {key: {**summarise(runs[key]), "runs": runs[key]} for key in args.settings}
    source = Path(runs["raw" if "raw" in runs else args.settings[0]][0]["run_dir"])
    codec_time = time_codecs(record_rollouts(source, args.rollouts, args.seeds[0]), args.repeats)
    codec_time["repeats"] = args.repeats
    result: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
        "steps": args.steps,
        "seeds": args.seeds,
        "settings": settings,
        "codec_time": codec_time,
    }
    if "raw" in settings:
        ref = settings["raw"]["eval_return_mean"]
        targets = {}
        for key, limit in (("auto", 35.0), ("int8", 20.0)):
            if key in settings:
                r = settings[key]
                total = r["bytes_per_step"]["total"]
                within = abs(r["eval_return_mean"] - ref) <= 0.05 * abs(ref)
                targets[key] = (f"{total:.1f} B/step ({'≤' if total <= limit else '>'} {limit:g}), return "
                                f"{r['eval_return_mean']:.1f} vs raw {ref:.1f} ({'within' if within else 'not within'} 5%)")
        result["targets"] = targets
    if args.ale:
        ale: dict[str, Any] = {"steps": args.ale_steps, "runs": {}}
        for key in ("raw", "auto"):
            s, command = train(key, args.ale_steps, 1, run_dir, args.force, ALE_FLAGS, tag="Pong")
            rec = run_record(s, command, 1)
            rec["obs_codecs"] = ((rec["uplink"] or {}).get("codecs") or {}).get("obs", {})
            ale["runs"][key] = rec
        result["ale"] = ale
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "uplink.json").write_text(json.dumps(result, indent=2))
    (RESULTS / "uplink.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
