"""Soak: a long run's faults compressed in time, against the same run undisturbed.

For each seed, ``frugalrl train ppo`` runs twice on the same budget: once undisturbed, once under fire. Under fire,
a killer SIGKILLs a random worker process every 1-3 s (startup included) until ``--kills`` kills; the run is also
preempted (SIGTERM, then ``--resume``) ``--preemptions`` times and its head SIGKILLed once (``--resume`` from the
last time-based checkpoint, ``--checkpoint-every-s``). Every process's resident memory is sampled each second.

Reported per seed: kills delivered, worker restarts, resumes, env steps lost (trained past the checkpoint a resume
went back to), the final greedy return and the bytes of both runs, wall time, and each process's memory (start,
peak, end). Run::

    python benchmarks/soak.py --env CartPole-v1 --steps 300000 --seeds 101 102 --out soak
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from frugalrl.process import resident_mb

RESULTS = Path(__file__).parent / "results"
WORKER_ENTRY = "frugalrl.envs.backends.local"


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out += kids
        todo += kids
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Watch:
    """Samples the memory of a process tree every second; kills random workers on request."""

    def __init__(self, kills: int, rng: random.Random) -> None:
        self.kills_left, self.rng = kills, rng
        self.kills = 0
        self.workers_seen: set[int] = set()
        self.memory: dict[str, list[tuple[float, float]]] = {}
        self.proc: subprocess.Popen | None = None
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        next_kill = time.monotonic() + self.rng.uniform(1, 3)
        while not self._stop.wait(0.25):
            proc = self.proc
            if proc is None or proc.poll() is not None:
                continue
            now = time.monotonic()
            kids = descendants(proc.pid)
            for pid in [proc.pid, *kids]:
                mb = resident_mb(pid)
                if mb is not None:
                    role = "head" if pid == proc.pid else ("worker" if WORKER_ENTRY in cmdline(pid) else "other")
                    self.memory.setdefault(f"{role}:{pid}", []).append((round(now - self.t0, 2), round(mb, 1)))
            workers = [p for p in kids if WORKER_ENTRY in cmdline(p)]
            self.workers_seen.update(workers)
            if self.kills_left > 0 and now >= next_kill:
                if workers:
                    os.kill(self.rng.choice(workers), signal.SIGKILL)
                    self.kills += 1
                    self.kills_left -= 1
                next_kill = now + self.rng.uniform(1, 3)

    def close(self) -> None:
        self._stop.set()
        self.thread.join()


def train(args: list[str], watch: Watch | None, stop_after: float | None = None,
          sig: int = signal.SIGTERM) -> tuple[int, float]:
    """Run ``frugalrl train ARGS``; after ``stop_after`` seconds send ``sig``. Returns (exit code, wall seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "frugalrl.cli", "train", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    if watch is not None:
        watch.proc = proc
    try:
        if stop_after is not None:
            try:
                proc.wait(timeout=stop_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(sig)
        err = proc.communicate(timeout=3600)[1].decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode not in (0, 75, -signal.SIGKILL):
        print(err[-2000:], file=sys.stderr)
    return proc.returncode, time.monotonic() - t0


def memory_summary(series: list[tuple[float, float]]) -> dict[str, float]:
    """One process's memory: after warm-up (a third into its life), at its peak and end, and the growth between."""
    t_warm, warm = series[len(series) // 3]
    t_end, end = series[-1]
    return {"warm_mb": warm, "peak_mb": max(m for _, m in series), "end_mb": end, "seconds": round(t_end - series[0][0], 1),
            "growth_mb_per_min": round((end - warm) / max(t_end - t_warm, 1e-9) * 60, 2)}


def last_step(run: Path) -> int:
    """The env step of the last metrics row (what the run had trained when it died)."""
    steps = [json.loads(line).get("step", 0) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    return max(steps, default=0)


def checkpoint_step(run: Path) -> int:
    import torch

    return int(torch.load(run / "checkpoints" / "latest.pt", weights_only=False)["counters"]["env_steps"])


def soak(env: str, steps: int, seed: int, kills: int, preemptions: int, every_s: float, root: Path) -> dict[str, Any]:
    common = ["ppo", "--env", env, "--total-timesteps", str(steps), "--seed", str(seed), "--run-dir", str(root),
              "--no-progress", "--no-plots", "--no-tensorboard", "--checkpoint-every-s", str(every_s)]
    calm_code, calm_wall = train([*common, "--run-name", "calm"], None)
    calm = json.loads((root / "calm" / "summary.json").read_text())

    watch = Watch(kills, random.Random(seed))
    run = root / "fire"
    segments: list[dict[str, Any]] = []
    lost = 0
    wall = 0.0
    args = [*common, "--run-name", "fire"]
    # the first segments end by SIGTERM (preemption), one by SIGKILL of the head; the last runs to the end
    plan = [("SIGTERM", signal.SIGTERM)] * preemptions + [("SIGKILL head", signal.SIGKILL)]
    for i, (what, sig) in enumerate([*plan, ("end", None)]):
        stop_after = None if sig is None else calm_wall * (i + 1) / (len(plan) + 2)
        code, seconds = train(args, watch, stop_after, sig or signal.SIGTERM)
        wall += seconds
        segment: dict[str, Any] = {"stopped_by": what, "exit_code": code, "seconds": round(seconds, 1)}
        if sig == signal.SIGKILL:
            trained, saved = last_step(run), checkpoint_step(run)
            segment.update(trained_to=trained, checkpoint_at=saved)
            lost += max(0, trained - saved)
        elif (run / "summary.json").stat().st_mtime >= time.time() - seconds:
            summary = json.loads((run / "summary.json").read_text())
            segment.update(restarts=summary["restarts"], env_steps=summary["env_steps"],
                           stop_reason=summary["stop_reason"])
        segments.append(segment)
        args = ["ppo", "--resume", str(run), "--no-progress"]
        if code == 0:
            break
    watch.close()
    time.sleep(2.0)  # a worker whose head died exits within a second
    orphans = [p for p in watch.workers_seen if resident_mb(p) is not None]
    fire = json.loads((run / "summary.json").read_text())
    memory = {name: memory_summary(series) for name, series in watch.memory.items() if len(series) >= 20}
    return {
        # restart events travel in the checkpoints: the last summary counts those of every segment it continues
        "seed": seed, "kills": watch.kills, "worker_restarts": fire["restarts"],
        "orphan_processes": len(orphans), "segments": len(segments),
        "resumes_kept": len(fire["resumes"]),  # a resume whose progress a later SIGKILL lost is not in the history
        "steps_lost": lost, "segment_log": segments,
        "env_steps": {"calm": calm["env_steps"], "fire": fire["env_steps"]},
        "eval_return": {"calm": calm["eval_return_mean"], "fire": fire["eval_return_mean"]},
        "bytes": {"calm": calm["bytes"]["total"], "fire": fire["bytes"]["total"]},
        "wall_seconds": {"calm": round(calm_wall, 1), "fire": round(wall, 1)},
        "exit_codes": {"calm": calm_code, "fire": [s["exit_code"] for s in segments]},
        "memory": memory,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[101, 102])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--preemptions", type=int, default=2)
    ap.add_argument("--checkpoint-every-s", type=float, default=5.0)
    ap.add_argument("--out", default="soak")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            row = soak(args.env, args.steps, seed, args.kills, args.preemptions, args.checkpoint_every_s, Path(tmp))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("memory", "segment_log")}), flush=True)
    out = {"command": "python benchmarks/soak.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
           "env": args.env, "steps": args.steps, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
