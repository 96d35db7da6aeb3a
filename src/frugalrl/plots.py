"""PNG figures from a run directory: return vs steps and vs time, syncs per worker, bytes by kind."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from frugalrl.runs import read_metrics  # noqa: E402


def make_plots(run_dir: str | Path) -> list[Path]:
    """Draw every plot the run's files allow into ``run_dir/plots``; return the paths written."""
    run_dir = Path(run_dir)
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    rows = read_metrics(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    written: list[Path] = []

    ret = [r for r in rows if r.get("train/episode_return") is not None]
    evals = [r for r in rows if r.get("eval/return_mean") is not None]
    for x_key, label, fname in (("step", "env steps", "return_vs_steps.png"), ("time", "wall seconds", "return_vs_time.png")):
        if not ret and not evals:
            break
        fig, ax = plt.subplots(figsize=(6, 4))
        if ret:
            ax.plot([r[x_key] for r in ret], [r["train/episode_return"] for r in ret], label="training episodes (mean)")
        if evals:
            ax.plot([r[x_key] for r in evals], [r["eval/return_mean"] for r in evals], "o-", label="evaluation")
        ax.set_xlabel(label)
        ax.set_ylabel("episode return")
        ax.set_title(f"{summary.get('algo', '')} on {summary.get('env_id', '')}")
        ax.legend()
        ax.grid(alpha=0.3)
        written.append(_save(fig, out / fname))

    per_worker = (summary.get("weight_syncs") or {}).get("per_worker")
    sync_rows = [r for r in rows if "syncs/total" in r]
    if per_worker:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        axes[0].bar(range(len(per_worker)), per_worker)
        axes[0].set_xlabel("worker")
        axes[0].set_ylabel("weight syncs")
        axes[0].set_title("syncs per worker")
        if sync_rows:
            axes[1].plot([r["step"] for r in sync_rows], [r["syncs/total"] for r in sync_rows])
            axes[1].set_xlabel("env steps")
            axes[1].set_ylabel("cumulative syncs (all workers)")
            axes[1].grid(alpha=0.3)
        written.append(_save(fig, out / "syncs_per_worker.png"))

    nbytes = summary.get("bytes") or {}
    kinds = {k: v for k, v in nbytes.items() if isinstance(v, int) and k not in ("total", "messages") and v > 0}
    if kinds:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar(list(kinds), [v / 1e6 for v in kinds.values()])
        ax.set_ylabel("MB")
        ax.set_title(f"bytes by kind (total {nbytes.get('total', 0) / 1e6:.2f} MB)")
        ax.tick_params(axis="x", rotation=30)
        written.append(_save(fig, out / "bytes_by_kind.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
