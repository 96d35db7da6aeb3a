"""How fast a run's metrics files grow, with a row for every update and with ``--log-every-s``.

Runs ``frugalrl train ALGO --env ENV --total-timesteps N`` once per ``--log-every-s`` value (default 0 and 1), one
after the other, and reads each run directory: rows in ``metrics.jsonl``, bytes of it and of the TensorBoard
events, training seconds, and the growth that makes per hour of training; the evaluation return shows that the
run itself is the same. Writes ``results/metrics_growth.json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _commit import measured_commit


def one_run(algo: str, env: str, steps: int, every_s: float, root: Path, seed: int) -> dict:
    """One training run with ``--log-every-s every_s`` and what its metrics files hold."""
    name = f"every-{every_s:g}"
    argv = [sys.executable, "-m", "frugalrl.cli", "train", algo, "--env", env, "--total-timesteps", str(steps),
            "--seed", str(seed), "--log-every-s", str(every_s), "--progress", "false", "--plots", "false",
            "--run-dir", str(root), "--run-name", name]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed:\n{done.stderr[-2000:]}")
    run = root / name
    summary = json.loads((run / "summary.json").read_text())
    metrics = (run / "metrics.jsonl").stat().st_size
    events = sum(p.stat().st_size for p in run.glob("events.out.tfevents.*"))
    seconds = summary["train_seconds"]
    return {"log_every_s": every_s, "command": shlex.join(["frugalrl", *argv[3:-4]]), "updates": summary["updates"],
            "rows": len((run / "metrics.jsonl").read_text().splitlines()), "metrics_bytes": metrics,
            "events_bytes": events, "train_seconds": seconds,
            "mb_per_hour": (metrics + events) / 1e6 / seconds * 3600, "eval_return_mean": summary["eval_return_mean"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=float, nargs="+", default=[0.0, 1.0], help="--log-every-s values to run")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "metrics_growth.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="frl-growth-") as root:
        for every_s in args.every:
            rows.append(one_run(args.algo, args.env, args.steps, every_s, Path(root), args.seed))
            r = rows[-1]
            print(f"--log-every-s {every_s:g}: {r['rows']} rows, {(r['metrics_bytes'] + r['events_bytes']) / 1e3:.0f} kB"
                  f" in {r['train_seconds']:.1f} s of training: {r['mb_per_hour']:.1f} MB an hour;"
                  f" evaluation {r['eval_return_mean']:.1f}", flush=True)
    out = {"command": shlex.join(["benchmarks/metrics_growth.py", *sys.argv[1:]]), "commit": measured_commit(),
           "date": time.strftime("%Y-%m-%d"), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
