"""Run directories: config, metrics, TensorBoard events, checkpoints, summary and plots.

Layout of ``runs/<name>/``::

    config.json        everything needed to rerun (the dataclass config, plus versions)
    metrics.jsonl      one JSON row per logged iteration (also the source of the plots)
    events.out.tfevents.*   TensorBoard
    checkpoints/       latest.pt (agent state dict + policy spec), and periodic ones
    summary.json       algo, env_id, seed, env_steps, wall_seconds, eval_return_mean/std,
                       weight_syncs {total, per_worker}, bytes {kind: n, ..., total}, ...
    plots/*.png        return vs steps and vs time, syncs per worker, bytes by kind
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch


def _jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if isinstance(obj, float | int | str | bool) or obj is None:
        return obj
    return str(obj)


class Run:
    """One training run's directory and its writers."""

    def __init__(self, root: str | Path, name: str, config: Any, tensorboard: bool = True) -> None:
        self.dir = Path(root) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "checkpoints").mkdir(exist_ok=True)
        self.config = _jsonable(config)
        meta = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        self._write_json("config.json", {**self.config, "_meta": meta})
        self._metrics = open(self.dir / "metrics.jsonl", "w")  # noqa: SIM115 - closed in finish()
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir))
        self.start = time.monotonic()

    def log(self, step: int, values: dict[str, Any]) -> None:
        """Record scalar ``values`` at ``step`` env steps (TensorBoard + metrics.jsonl)."""
        row = {"step": int(step), "time": round(time.monotonic() - self.start, 3), **_jsonable(values)}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)

    def save_checkpoint(self, agent: torch.nn.Module, step: int, extra: dict[str, Any] | None = None) -> Path:
        """Write ``checkpoints/latest.pt`` (and ``step_<n>.pt``): state dict, policy spec, step."""
        payload = {"state_dict": agent.state_dict(), "spec": agent.spec.to_json(), "step": int(step), **(extra or {})}
        path = self.dir / "checkpoints" / f"step_{int(step)}.pt"
        torch.save(payload, path)
        torch.save(payload, self.dir / "checkpoints" / "latest.pt")
        return path

    def finish(self, summary: dict[str, Any], plots: bool = True) -> dict[str, Any]:
        """Write summary.json, close writers, draw the plots; return the summary."""
        summary = _jsonable(summary)
        self._write_json("summary.json", summary)
        self._metrics.close()
        if self._tb is not None:
            self._tb.close()
        if plots:
            from frugalrl.plots import make_plots

            make_plots(self.dir)
        return summary

    def _write_json(self, name: str, data: Any) -> None:
        (self.dir / name).write_text(json.dumps(data, indent=2) + "\n")


def load_checkpoint(path: str | Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Rebuild the agent saved by :meth:`Run.save_checkpoint` (a run directory or a ``.pt`` file)."""
    from frugalrl.nets import build_policy

    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / "latest.pt"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    agent = build_policy(payload["spec"])
    agent.load_state_dict(payload["state_dict"])
    agent.eval()
    return agent, payload


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
