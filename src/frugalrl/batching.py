"""The batch an update learns from, kept when the number of workers changes: at the start (over a preset's or
the defaults' batch, :func:`frugalrl.presets.configure`) and on resume (over the run's own)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

MIN_FRAGMENT = 16
"""The fewest steps per env that :func:`keep_batch` shortens a fragment to: shorter ones carry too little per round
trip and cut GAE's returns every few steps. Beyond it the batch grows, in minibatches of the tuned size."""
BATCH_FIELDS = ("workers", "envs_per_worker", "num_steps", "num_minibatches")


def keep_batch(cfg: Any, values: dict[str, Any], given: dict[str, Any], note: Callable[[str], object],
               origin: str) -> None:
    """Where ``given`` changes the workers or envs per worker of a cluster config (PPO's, IMPALA's) but not
    ``num_steps``, set ``num_steps`` so that an update still learns from the batch the preset (or the
    dataclass's defaults) was tuned with, as RLlib keeps its ``train_batch_size`` over any number of env runners.
    Otherwise 64 workers would make each update 32 times the tuned one, with 32 times fewer gradient steps per env
    step. Fragments go no shorter than :data:`MIN_FRAGMENT` steps; beyond that the batch grows and
    ``num_minibatches`` with it (unless given), so that minibatches keep their tuned size. ``note`` hears the change;
    ``origin`` names where ``values`` came from (``preset LunarLander-v3``, ``the run resumed``)."""
    from frugalrl.config import ClusterConfig

    cluster = isinstance(cfg, ClusterConfig)  # PPO's, IMPALA's (HSA2C's workers each learn from their own)
    if not cluster or "num_steps" in given or not {"workers", "envs_per_worker"} & set(given):
        return
    tuned: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(cfg) if f.name in BATCH_FIELDS}
    tuned.update({k: v for k, v in values.items() if k in tuned})
    batch = tuned["workers"] * tuned["envs_per_worker"] * tuned["num_steps"]
    envs = cfg.workers * cfg.envs_per_worker
    steps = max(MIN_FRAGMENT, round(batch / envs))
    if steps == cfg.num_steps:
        return
    cfg.num_steps = steps
    cfg.sources["num_steps"] = source = f"batch of {origin} kept over {cfg.workers} × {cfg.envs_per_worker} envs"
    said = f"{steps} steps per env per fragment keep its {batch}-step updates"
    minibatches = tuned.get("num_minibatches")
    if envs * steps > batch and minibatches and "num_minibatches" not in given:
        cfg.num_minibatches = max(1, round(minibatches * envs * steps / batch))
        cfg.sources["num_minibatches"] = source
        said = (f"{steps} steps per env per fragment (the fewest) make {envs * steps}-step updates, in "
                f"{cfg.num_minibatches} minibatches of its {batch // minibatches} steps")
    cfg.validate()
    note(f"{cfg.workers} × {cfg.envs_per_worker} envs instead of the {tuned['workers']} × {tuned['envs_per_worker']} "
         f"of {origin}: {said} (--num-steps sets them)")


def keep_batch_on_resume(cfg: Any, saved: dict[str, Any], given: dict[str, Any],
                         note: Callable[[str], object]) -> None:
    """A run resumed on other workers or envs per worker (``given``) but no ``num_steps`` keeps the batch it ran
    with (``saved``: its ``config.json``), as :func:`keep_batch` keeps a preset's at the start: a run preempted on
    64 workers and resumed on 32 goes on with updates of the same size, not half."""
    keep_batch(cfg, {k: saved[k] for k in BATCH_FIELDS if k in saved}, given, note, "the run resumed")
