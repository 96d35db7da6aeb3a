"""What ``ClusterEnv.step()`` moves on the wire per vector step, by kind, with header numbers and without.

The drop-in path sends a request and a reply per worker per step; their JSON headers used to be most of the bytes
(:mod:`frugalrl.wire.headers`). For each env and layout this steps the same seeded envs with the same seeded
random actions three times and reports bytes per vector step by kind:

  numbered   the serial backend as it is (header numbers on)
  full       the serial backend with books that never number a header: every message with its full header, as
             before header numbers (the baseline of the comparison; nothing else differs)
  local      the local backend as it is (worker processes, shared memory): it must count what ``numbered`` counts

``--train ENV`` adds the rollout path: a seeded PPO run with the env's preset on the serial backend, three times
(the same trajectory each time: only the headers' bytes differ), with books as they are (``templated``: header
numbers and templates), books without templates (``numbers only``), and books that never shorten (``full``).
A rollout's reply differs from the last in its weight version and how many episodes ended, so it is never
numbered: its template is.

Example::

    python benchmarks/step_bytes.py --envs CartPole-v1 LunarLander-v3 HalfCheetah-v5 --layouts 2x2 2x8 \
        --train LunarLander-v3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _commit import measured_commit

from frugalrl import ClusterEnv
from frugalrl.envs.backends import serial
from frugalrl.wire.headers import HeaderBook

RESULTS = Path(__file__).parent / "results"


class FullHeaders(HeaderBook):
    """A book that numbers nothing: every header crosses in full."""

    def short_form(self, header: bytes, note: bool = False) -> bytes | None:
        return None


class NumbersOnly(HeaderBook):
    """A book that numbers headers but no templates: what the books did before templates."""

    def __init__(self) -> None:
        super().__init__(templates=False)


BOOKS: dict[str, type[HeaderBook]] = {"templated": HeaderBook, "numbers only": NumbersOnly, "full": FullHeaders}


def measure_training(env_id: str, steps: int, seed: int) -> dict[str, Any]:
    """Bytes per env step by direction and kind of one seeded PPO run (the env's preset, serial backend) with each
    of :data:`BOOKS`, and whether the three runs learned the same (their evaluation and their bytes but control)."""
    import tempfile

    from frugalrl.algos.ppo import train
    from frugalrl.presets import make_config

    runs: dict[str, Any] = {}
    for name, cls in BOOKS.items():
        book, serial.HeaderBook = serial.HeaderBook, cls  # type: ignore[misc]
        try:
            with tempfile.TemporaryDirectory() as tmp:
                cfg = make_config("ppo", env_id, seed=seed, total_timesteps=steps, backend="serial", run_dir=tmp,
                                  progress=False, tensorboard=False, plots=False, eval_episodes=2)
                summary = train(cfg)
        finally:
            serial.HeaderBook = book  # type: ignore[misc]
        b, n = summary["bytes"], summary["env_steps"]
        runs[name] = {"env_steps": n, "total_per_step": round(b["total"] / n, 3),
                      **{d: {k: round(v / n, 3) for k, v in b[d].items()} for d in ("up", "down")},
                      "eval_return": summary["eval_return_mean"], "train_return": summary["train_return_mean_last100"],
                      "weight_syncs": summary["weight_syncs"]["total"]}
    same = {json.dumps({k: v for k, v in r.items() if k not in ("up", "down", "total_per_step")}, sort_keys=True)
            for r in runs.values()}
    payload = {json.dumps({d: {k: v for k, v in r[d].items() if k != "control"} for d in ("up", "down")},
                          sort_keys=True) for r in runs.values()}
    return {"env": env_id, "steps": steps, "runs": runs, "same_run": len(same) == len(payload) == 1}


def measure(env_id: str, workers: int, per_worker: int, steps: int, how: str, seed: int) -> dict[str, Any]:
    """Bytes by kind per vector step of ``steps`` seeded random steps (``how``: numbered, full or local)."""
    book = serial.HeaderBook
    if how == "full":
        serial.HeaderBook = FullHeaders  # type: ignore[misc]
    try:
        env = ClusterEnv(env_id, num_workers=workers, envs_per_worker=per_worker, seed=seed,
                         backend="local" if how == "local" else "serial", inline_workers=0 if how == "local" else None)
    finally:
        serial.HeaderBook = book  # type: ignore[misc]
    try:
        env.action_space.seed(seed)
        actions = [env.action_space.sample() for _ in range(steps)]
        env.reset(seed=seed)
        for a in actions:
            env.step(a)
        kinds = {k: v for k, v in env.meter.by_kind().items() if v}
    finally:
        env.close()
    return {"per_step": {k: round(v / steps, 2) for k, v in kinds.items()},
            "total_per_step": round(sum(kinds.values()) / steps, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="*", default=["CartPole-v1", "LunarLander-v3", "HalfCheetah-v5"])
    ap.add_argument("--layouts", nargs="+", default=["2x2", "2x8"], help="WORKERSxENVS_PER_WORKER")
    ap.add_argument("--steps", type=int, default=2000, help="vector steps per run (reset included)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train", nargs="*", default=[], metavar="ENV", help="envs of the PPO runs (rollout path)")
    ap.add_argument("--train-steps", type=int, default=40_960)
    ap.add_argument("--out", default="step_bytes")
    args = ap.parse_args()
    rows = []
    for env_id in args.envs:
        for layout in args.layouts:
            w, k = (int(x) for x in layout.split("x"))
            row: dict[str, Any] = {"env": env_id, "workers": w, "envs_per_worker": k}
            for how in ("numbered", "full", "local"):
                row[how] = measure(env_id, w, k, args.steps, how, args.seed)
            row["full_over_numbered"] = round(row["full"]["total_per_step"] / row["numbered"]["total_per_step"], 2)
            row["local_equals_numbered"] = row["local"]["per_step"] == row["numbered"]["per_step"]
            rows.append(row)
            print(f"{env_id} {layout}: {row['numbered']['total_per_step']} B per vector step with header numbers, "
                  f"{row['full']['total_per_step']} in full ({row['full_over_numbered']}x); control "
                  f"{row['numbered']['per_step'].get('control')} against {row['full']['per_step'].get('control')}; "
                  f"local backend equal: {row['local_equals_numbered']}", flush=True)
    training = []
    for env_id in args.train:
        row = measure_training(env_id, args.train_steps, args.seed)
        training.append(row)
        print(f"PPO {env_id} {args.train_steps} steps: " + ", ".join(
            f"{name} {r['total_per_step']} B per env step (control up {r['up'].get('control', 0)}, down "
            f"{r['down'].get('control', 0)})" for name, r in row["runs"].items()) + f"; the same run: {row['same_run']}",
            flush=True)
    commit = measured_commit()
    out = {"command": "python benchmarks/step_bytes.py " + " ".join(
               ["--envs", *args.envs, "--layouts", *args.layouts, "--steps", str(args.steps),
                *(["--train", *args.train, "--train-steps", str(args.train_steps)] if args.train else [])]),
           "date": time.strftime("%Y-%m-%d"), "commit": commit, "steps": args.steps, "seed": args.seed, "rows": rows,
           "training": training}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / (args.out + '.json')}")


if __name__ == "__main__":
    main()
