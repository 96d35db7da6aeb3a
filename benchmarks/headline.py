"""The README's headline table, re-measured on one commit under the claims protocol (docs/benchmarks.md#protocol).

    make headline                                    # every row at its full budget, then the README table
    python benchmarks/headline.py --rows ppo dropin  # some rows (the others keep their JSONs)
    python benchmarks/headline.py --quick            # a smoke run: tiny budgets, into results/headline/quick/
    python benchmarks/headline.py --report           # summaries and the README table from the raw JSONs only

Each row runs its frugal side and its reference back to back, through the benchmark script that owns the
comparison (``ROWS`` names the commands), on held-out reporting seeds (101 and up; defaults were tuned on seeds
1–15). The script's own JSON lands in ``results/headline/<row>-raw.json``; ``results/headline/<row>.json`` holds
the commit, machine, date, load average and torch threads of the measurement, the commands, the budget and what
the full budget trims, and the summary the README row prints. A row whose JSON already carries this commit and
budget is skipped (``--force`` reruns it), so the table can be built over several sittings on one commit; per-run
caches live under ``results/headline/cache/<commit>/`` (not in git). A row that needs what this machine lacks (a
shaped link needs root and the netem qdisc) is skipped and says why.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from learning_suite import sample_std

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
HEADLINE = RESULTS / "headline"
Budget = Literal["full", "quick"]
SEEDS = (101, 102, 103)
"""Reporting seeds: disjoint from the seeds every default and preset was tuned on (1–15)."""


@dataclass(frozen=True)
class Row:
    """One headline claim: the commands that measure both sides, and how the README row is read from their JSON."""

    key: str
    claim: str
    """What the row compares, as the README says it."""
    commands: Callable[[Budget, str, Path], list[list[str]]]
    """The benchmark commands (after ``python``) at a budget, writing the raw JSON ``out`` with caches in ``cache``."""
    summarise: Callable[[dict[str, Any]], dict[str, Any]]
    """The row's figures, from the raw JSON."""
    trims: str = ""
    """What the full budget cuts from the reference's own budget or the original experiment, and why."""
    does_not_show: str = ""
    """What a reader should not take the row to mean."""
    needs: Callable[[], str | None] = field(default=lambda: None)
    """Why this machine cannot measure the row (None: it can)."""


def _seeds(budget: Budget, n: int = 3) -> list[str]:
    return [str(s) for s in (SEEDS[:1] if budget == "quick" else range(101, 101 + n))]


def _pm(values: list[float]) -> dict[str, Any]:
    return {"mean": float(np.mean(values)), "std": sample_std(values), "per_seed": [round(float(v), 2) for v in values]}


# ---------------------------------------------------------------------------------------------- rows
UPLINK = ("observations", "actions", "rewards", "behaviour", "info")
"""The byte kinds of experience sent from the workers to the learner."""


def ppo_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    steps = ["--steps", "4096"] if budget == "quick" else []
    return [["benchmarks/learning_suite.py", "--envs", "LunarLander-v3", "--variants", "frugal-aaps-bf16",
             "frugal-every-fp32", "sb3-zoo", "--seeds", *_seeds(budget), *steps, "--out", out, "--cache", str(cache)]]


def ppo_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """Returns, wall time with start-up (each run a fresh process), weight, uplink and total bytes per env step."""
    runs = list(raw["runs"].values())
    out: dict[str, Any] = {"steps": raw["envs"]["LunarLander-v3"]["steps"]}
    for variant in ("frugal-aaps-bf16", "frugal-every-fp32", "sb3-zoo"):
        rs = sorted((r for r in runs if r["variant"] == variant), key=lambda r: r["seed"])
        out[variant] = {"seeds": [r["seed"] for r in rs], "return": _pm([r["final_return"] for r in rs]),
                        "process_wall_s": float(np.mean([r["process_wall_seconds"] for r in rs])),
                        "train_s": float(np.mean([r["train_seconds"] for r in rs])),
                        "weight_bytes_per_step": float(np.mean([r["bytes"].get("weights", 0) / r["env_steps"] for r in rs])),
                        "uplink_bytes_per_step": float(np.mean([sum(r["bytes"].get(k, 0) for k in UPLINK) / r["env_steps"]
                                                                for r in rs])),
                        "total_bytes_per_step": float(np.mean([r["bytes"]["total"] / r["env_steps"] for r in rs])),
                        "torch_threads": rs[0].get("torch_threads") if rs else None}
    f, e, s = out["frugal-aaps-bf16"], out["frugal-every-fp32"], out["sb3-zoo"]
    out["wall_vs_sb3"] = f["process_wall_s"] / s["process_wall_s"]
    out["weight_bytes_fewer"] = e["weight_bytes_per_step"] / max(f["weight_bytes_per_step"], 1e-12)
    return out


def dropin_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    if budget == "quick":
        return [["benchmarks/dropin_speed.py", "--envs", "CartPole-v1", "--workers", "2", "--steps", "30", "--warmup",
                 "5", "--repeats", "1", "--cleanrl", "--cleanrl-steps", "2048", "--out", out]]
    return [["benchmarks/dropin_speed.py", "--envs", "CartPole-v1", "LunarLander-v3", "--workers", "2", "--cleanrl",
             "--out", out]]


def dropin_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """Env steps/s of each method over SyncVectorEnv's, per env (2 workers), and CleanRL's ppo.py wall time."""
    out: dict[str, Any] = {r["env"]: {"vs_sync": r["vs_sync"], "steps_per_s": r["steps_per_s"],
                                      "envs_per_worker": r["envs_per_worker"]} for r in raw["rows"]}
    c = raw.get("cleanrl_ppo")
    if c:
        out["cleanrl_ppo"] = {"time_ratio": c["time_ratio"], "sync_return": c["sync"]["last_return"],
                              "clusterenv_return": c["clusterenv"]["last_return"], "steps": c["total_timesteps"]}
    return out


def compress_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    quick = ["--repeats", "1", "--calls", "3", "--frames", "32", "--distill-steps", "5"] if budget == "quick" else []
    return [["benchmarks/compress_table6.py", *quick, "--out", str(RESULTS / f"{out}.json")]]


def compress_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """The whole chain against the fp32 PyTorch original: time per state at batch 1 and 16, weights on the wire."""
    first, last = raw["rows"][0], raw["rows"][-1]
    return {"speedup_batch1": last["speedup_vs_torch_fp32_original"]["1"],
            "speedup_batch16": last["speedup_vs_torch_fp32_original"].get("16"),
            "weights_smaller": first["wire_bytes"] / last["wire_bytes"], "chain": last["network"],
            "kl_mean": last.get("kl_mean")}


def accerl_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    steps = ["--steps", "4096"] if budget == "quick" else ["--impala-steps", "1000000"]
    envs = ["CartPole-v1"] if budget == "quick" else ["CartPole-v1", "LunarLander-v3"]
    return [["benchmarks/learning_suite.py", "--envs", *envs, "--variants", "impala-copy", "impala-full",
             "--seeds", *_seeds(budget), *steps, "--out", out, "--cache", str(cache)]]


def accerl_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """Per env: compressed actors against learner copies (AAPS on for both), returns, weight bytes, wall time."""
    out: dict[str, Any] = {}
    for env, entry in raw["table"].items():
        v = entry["variants"]
        if "impala-full" not in v or "impala-copy" not in v:
            continue
        full, copy = v["impala-full"], v["impala-copy"]
        runs = raw["runs"].values()
        wall = {name: float(np.mean([r["process_wall_seconds"] for r in runs if r["env"] == env and r["variant"] == name]))
                for name in ("impala-full", "impala-copy")}
        out[env] = {"steps": entry["impala_steps"],
                    "full": _pm(full["final_return_per_seed"]), "copy": _pm(copy["final_return_per_seed"]),
                    "weight_bytes_fewer_than_every_copy": full.get("weight_bytes_fewer_than_every_copy"),
                    "wall_vs_copy": wall["impala-full"] / wall["impala-copy"]}
    return out


def pipeline_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    steps = ["--steps", "2048"] if budget == "quick" else []
    return [["benchmarks/pipeline_suite.py", "--envs", "CartPole-v1", "--cuts", "dense", "p0.99",
             "--seeds", *_seeds(budget), *steps, "--out", out, "--cache", str(cache)]]


def pipeline_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """Sparse (p = 0.99) against dense cut gradients: returns and gradient bytes."""
    v, steps = raw["table"]["CartPole-v1"]["variants"], raw["table"]["CartPole-v1"]["steps"]
    return {"steps": steps, "dense": _pm(v["dense"]["final_return_per_seed"]),
            "p0.99": _pm(v["p0.99"]["final_return_per_seed"]), "gradients_vs_dense": v["p0.99"]["gradients_vs_base"],
            "total_vs_dense": v["p0.99"]["total_bytes_mean"] / v["dense"]["total_bytes_mean"]}


def lda_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    if budget == "quick":
        return [["benchmarks/lda_baselines.py", "--quick", "--corpus", "synthetic", "--no-sklearn", "--gensim-workers",
                 "1", "--dpsvi", "1x1", "--out", f"{out}-s0"]]
    return [["benchmarks/lda_baselines.py", "--corpus", "synthetic-large", "--no-sklearn", "--gensim-workers", "1",
             "2", "--dpsvi", "1x1", "--seed", str(seed), "--out", f"{out}-s{seed}"] for seed in (0, 1, 2)]


def lda_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """Per seed: seconds to gensim's target perplexity, DPSVI with and without its worker start-up."""
    seeds = []
    for seed, part in sorted(raw.items()):
        methods = {m["method"]: m for m in part["corpora"][0]["methods"]}
        d = methods["dpsvi-w1p1"]
        t = d.get("time_to_target_s")
        seeds.append({"seed": seed, "dpsvi_s": t, "dpsvi_startup_s": d.get("startup_seconds"),
                      "dpsvi_with_startup_s": None if t is None else t + (d.get("startup_seconds") or 0.0),
                      **{f"{m}_s": methods[m].get("time_to_target_s") for m in ("gensim-w1", "gensim-w2") if m in methods}})
    def mean(key: str) -> float | None:
        vals = [s[key] for s in seeds if s.get(key) is not None]
        return float(np.mean(vals)) if len(vals) == len(seeds) else None
    return {"seeds": seeds, **{f"{k}_mean": mean(k) for k in ("dpsvi_s", "dpsvi_with_startup_s", "gensim-w1_s",
                                                              "gensim-w2_s")}}


def hsa2c_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    scale = ["--budget-scale", "0.01", "--time-limit-scale", "0.05"] if budget == "quick" else [
        "--budget-scale", "0.5", "--time-limit-scale", "0.5"]
    return [["benchmarks/hsa2c_vs_sync.py", "--envs", "LunarLander-v3", "--variants", "hsa2c", "a3c",
             "--seeds", *_seeds(budget, 5), *scale, "--out", out]]


def hsa2c_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """HSA2C (B = 10) against DDRL A3C (B = 1) with the same recipe: seeds reaching 200, time, MB."""
    out: dict[str, Any] = {}
    for r in raw["rows"]:
        if r["target"] != 200.0:
            continue
        name = "hsa2c" if r["variant"].startswith("HSA2C") else "a3c"
        out[name] = {"reached": r["time_to_target"]["reached"], "time_s": r["time_to_target"]["mean"],
                     "time_every_seed_s": r["time_to_target"]["all_mean"],
                     "lower_bound": r["time_to_target"]["all_lower_bound"], "mb_to_target": r.get("mb_to_target"),
                     "final": _pm(r["final_eval_returns"]), "steps": r["config"]["total_timesteps"],
                     "time_limit_s": r["config"]["time_limit_s"]}
    return out


def a2c_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    common = ["benchmarks/a2c_reference.py", "--env", "LunarLander-v3", "--variants", "hsa2c", "a3c", "sb3-zoo"]
    if budget == "quick":
        return [[*common, "--steps", "2000", "--seeds", *_seeds(budget), "--out", f"{out}-200k"]]
    return [[*common, "--steps", "200000", "--seeds", *_seeds(budget, 5), "--out", f"{out}-200k"],
            [*common, "--steps", "1000000", "--seeds", *_seeds(budget), "--out", f"{out}-1m"]]


def a2c_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """HSA2C and A3C (frugalrl's recipe) against SB3's A2C with rl-zoo's entry: at the zoo's budget (200k) and at
    1M, where the zoo's linear schedule is stretched 5×."""
    out: dict[str, Any] = {}
    for budget, part in raw.items():
        b: dict[str, Any] = {"steps": part["steps"]}
        for r in part["rows"]:
            b[r["variant"]] = {"return": _pm(r["finals"]), "train_s": r["train_s_mean"], "wall_s": r.get("wall_s_mean")}
        h, s = b["hsa2c"], b["sb3-zoo"]
        if h["wall_s"] and s["wall_s"]:
            b["wall_vs_sb3"] = h["wall_s"] / s["wall_s"]
        out[budget] = b
    return out


def _shaped_link() -> str | None:
    """Why two hosts on a shaped link cannot be made here (None: they can; the rate needs tbf, not netem)."""
    from frugalrl import netem

    ok, why = netem.netns_available()
    return None if ok else why


def link_commands(budget: Budget, out: str, cache: Path) -> list[list[str]]:
    scale = (["--budget-scale", "0.01", "--time-limit-scale", "0.05"] if budget == "quick"
             else ["--budget-scale", "0.5", "--time-limit-scale", "0.75"])
    return [["benchmarks/hsa2c_link.py", "--rates", "50mbit", "--seeds", *_seeds(budget), *scale, "--out", out]]


ROWS: dict[str, Row] = {r.key: r for r in (
    Row("ppo", "PPO, AAPS δ = 0.05 + bf16 delta-coded weights, vs every-update fp32 and vs Stable-Baselines3 PPO "
        "(rl-zoo), LunarLander-v3", ppo_commands, ppo_summary,
        trims="none: 1M steps is rl-zoo's budget for this entry",
        does_not_show="one env; the other suite envs are in docs/benchmarks.md#learning-suite"),
    Row("dropin", "ClusterEnv as a drop-in vector env vs Gymnasium's SyncVectorEnv, 16 envs on 2 workers",
        dropin_commands, dropin_summary, trims="HalfCheetah and 4 workers (in dropin_speed.json)",
        does_not_show="2 cores: one worker runs inline in the head; more cores change every ratio"),
    Row("compress", "AcceRL compressor chain (prune, distill, int8, ONNX), Nature-CNN on Pong frames",
        compress_commands, compress_summary, does_not_show="time per state of the actor network, not learning"),
    Row("accerl", "AcceRL actors `prune:0.5,distill,int8,onnx` vs learner copies (AAPS on for both)", accerl_commands,
        accerl_summary, trims="IMPALA at 1M steps on both envs (the suite's budgets: CartPole 100k, LunarLander 2M); "
        "MinAtar and ALE left to the suite",
        does_not_show="learning at 2M steps, where the suite's target (200) is judged; MinAtar and ALE"),
    Row("pipeline", "Split-model PPO, CartPole-v1: p = 0.99 sparse cut gradients vs dense", pipeline_commands,
        pipeline_summary, trims="the suite's CartPole budget (40,960 steps)",
        does_not_show="the CarRacing traffic figure (docs/pipeline.md)"),
    Row("lda", "DPSVI (LDA on DPSGD, its defaults) vs gensim LdaMulticore, 100k documents, V = 50,000: seconds to "
        "gensim's target perplexity", lda_commands, lda_summary,
        does_not_show="a real corpus at this size (synthetic documents from an LDA model)"),
    Row("hsa2c", "HSA2C (B = 10) vs DDRL A3C (B = 1), the same recipe, LunarLander-v3, one machine", hsa2c_commands,
        hsa2c_summary, trims="1M steps or 60 s per run (hsa2c_vs_sync's 2M steps and 240 s, at its scales 0.5 × 0.5)"),
    Row("a2c", "HSA2C (B = 10) and A3C (the same recipe) vs Stable-Baselines3 A2C (rl-zoo), LunarLander-v3",
        a2c_commands, a2c_summary, trims="1M steps at 3 seeds (200k, rl-zoo's budget for this entry, at 5)",
        does_not_show="at 1M, rl-zoo's linear schedule is stretched 5× past what it was tuned for"),
    Row("link", "HSA2C vs DDRL A3C, workers across a 50 Mbit/s link", link_commands, hsa2c_summary,
        trims="1M steps or 90 s per run, 3 seeds (docs/dpsgd.md's run: 3M steps or 720 s, 5 seeds, 89 min)",
        does_not_show="a real network: two network namespaces on one 2-core machine, tbf-shaped",
        needs=_shaped_link),
)}
RUN_ORDER = ("dropin", "compress", "ppo", "pipeline", "lda", "hsa2c", "a2c", "accerl", "link")
QUICK_SKIPS = ("link",)
"""Rows ``--quick`` leaves out unless named: the link row builds a Ray cluster in network namespaces."""
"""The timing-sensitive row first, on a machine that has been quiet; then the others, most important first."""
assert sorted(RUN_ORDER) == sorted(ROWS)


def _read_raw(key: str, root: Path) -> dict[str, Any]:
    """A row's raw JSON (``lda``'s: one per seed, by seed)."""
    if key == "lda":
        return {p.stem.rsplit("-s", 1)[1]: json.loads(p.read_text()) for p in sorted(root.glob("lda-raw-s*.json"))}
    if key == "link":
        return json.loads((root / "link-raw_50mbit.json").read_text())
    if key == "a2c":
        return {p.stem.rsplit("-", 1)[1]: json.loads(p.read_text()) for p in sorted(root.glob("a2c-raw-*.json"))}
    return json.loads((root / f"{key}-raw.json").read_text())


# ---------------------------------------------------------------------------------------------- running
def commit() -> tuple[str, bool]:
    """HEAD's commit and whether the code differs from it (results and docs excluded)."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "benchmarks", "examples",
                            "pyproject.toml", ":!benchmarks/results"], capture_output=True, text=True).stdout.strip()
    return head or "unknown", bool(dirty)


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor(),
            "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "blas_threads": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}


def measure(row: Row, budget: Budget, root: Path, head: str, dirty: bool, force: bool) -> dict[str, Any] | None:
    """Run one row's commands (unless cached at this commit and budget) and write its JSON."""
    path = root / f"{row.key}.json"
    if path.exists() and not force:
        old = json.loads(path.read_text())
        if old.get("commit") == head and old.get("budget") == budget and not old.get("dirty"):
            print(f"[headline] {row.key}: cached at {head}", flush=True)
            return old
    why = row.needs()
    if why:  # recorded, so that the table says the row was not measured at this commit rather than show an old one
        print(f"[headline] {row.key}: skipped, {why}", flush=True)
        skipped = {"row": row.key, "claim": row.claim, "commit": head, "dirty": dirty, "budget": budget,
                   "date": time.strftime("%Y-%m-%d %H:%M %Z"), "skipped": why}
        path.write_text(json.dumps(skipped, indent=1))
        return None
    out = f"{root.relative_to(RESULTS)}/{row.key}-raw"
    cache = root / "cache" / head / row.key
    if force and cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    commands = row.commands(budget, out, cache)
    record: dict[str, Any] = {"row": row.key, "claim": row.claim, "commit": head, "dirty": dirty, "budget": budget,
                              "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(),
                              "load_avg_start": os.getloadavg(), "trims": row.trims,
                              "does_not_show": row.does_not_show,
                              "commands": ["python " + " ".join(c) for c in commands]}
    t0 = time.monotonic()
    for cmd in commands:
        print(f"[headline] {row.key}: python {' '.join(cmd)}", flush=True)
        done = subprocess.run([sys.executable, *cmd], cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"headline row {row.key!r} failed (exit {done.returncode}): python {' '.join(cmd)}")
    record["wall_seconds"] = round(time.monotonic() - t0, 1)
    record["load_avg_end"] = os.getloadavg()
    record["summary"] = row.summarise(_read_raw(row.key, root))
    path.write_text(json.dumps(record, indent=1))
    print(f"[headline] {row.key}: {record['wall_seconds']:.0f} s → {path.relative_to(ROOT)}", flush=True)
    return record


def report(root: Path) -> None:
    """Re-read every row's raw JSON into its summary, and its descriptions (claim, trims, what it does not show)
    from ``ROWS``; what was measured, its commit and date stay."""
    for key, row in ROWS.items():
        path = root / f"{key}.json"
        if path.exists() and "skipped" not in (record := json.loads(path.read_text())):
            record.update(claim=row.claim, trims=row.trims, does_not_show=row.does_not_show,
                          summary=row.summarise(_read_raw(key, root)))
            path.write_text(json.dumps(record, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=None, help="default: every row (--quick: but "
                   + ", ".join(QUICK_SKIPS) + ")")
    p.add_argument("--quick", action="store_true", help="tiny budgets into results/headline/quick/: a smoke run")
    p.add_argument("--force", action="store_true", help="rerun rows already measured at this commit")
    p.add_argument("--allow-dirty", action="store_true", help="measure uncommitted code (recorded as dirty)")
    p.add_argument("--report", action="store_true", help="only re-read the raw JSONs and rewrite the README table")
    args = p.parse_args(argv)
    budget: Budget = "quick" if args.quick else "full"
    root = HEADLINE / "quick" if args.quick else HEADLINE
    root.mkdir(parents=True, exist_ok=True)
    if args.report:
        report(root)
    else:
        head, dirty = commit()
        if dirty and not (args.quick or args.allow_dirty):
            raise SystemExit("the code differs from HEAD: commit it first (a headline row names the commit it "
                             "measured), or pass --allow-dirty")
        t0 = time.monotonic()
        rows = args.rows or [k for k in RUN_ORDER if not (args.quick and k in QUICK_SKIPS)]
        for key in rows:
            measure(ROWS[key], budget, root, head, dirty, args.force)
        print(f"[headline] done in {time.monotonic() - t0:.0f} s", flush=True)
    if not args.quick:
        subprocess.run([sys.executable, str(ROOT / "docs" / "gen_tables.py"), "--update-readme"], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
