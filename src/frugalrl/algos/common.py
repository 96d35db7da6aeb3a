"""What every training loop shares: config checks, the ClusterEnv from config fields, progress, names."""

from __future__ import annotations

from typing import Any

from frugalrl.envs.cluster import ClusterEnv
from frugalrl.sync import make_sync_rule


def check_fields(
    cfg: Any,
    positive_ints: tuple[str, ...] = (),
    positive: tuple[str, ...] = (),
    nonneg: tuple[str, ...] = (),
    unit: tuple[str, ...] = (),
) -> None:
    """Raise ``ValueError`` naming the first field of ``cfg`` outside its range.

    ``positive_ints``: integers ≥ 1; ``positive``: numbers > 0; ``nonneg``: numbers ≥ 0; ``unit``: in [0, 1].
    """
    for name in positive_ints:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name in positive:
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{name} must be > 0, got {getattr(cfg, name)!r}")
    for name in nonneg:
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)!r}")
    for name in unit:
        if not 0 <= getattr(cfg, name) <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {getattr(cfg, name)!r}")


def make_cluster_env(cfg: Any) -> ClusterEnv:
    """The ClusterEnv the common config fields describe (env, workers, backend, sync rule, codec, seed)."""
    return ClusterEnv(
        cfg.env,
        num_workers=cfg.workers,
        envs_per_worker=cfg.envs_per_worker,
        backend=cfg.backend,
        sync=make_sync_rule(cfg.sync, cfg.kl_threshold, cfg.sync_interval),
        seed=cfg.seed,
        env_kwargs=cfg.env_kwargs,
        weights_codec=cfg.weights_codec,
        ray_address=cfg.ray_address,
    )


def cluster_summary(envs: ClusterEnv) -> dict[str, Any]:
    """The ClusterEnv part of a run summary: sync rule, syncs, bytes, restarts, layout."""
    st = envs.stats()
    return {
        "sync_rule": st["sync_rule"],
        "weight_syncs": st["weight_syncs"],
        "bytes": st["bytes"],
        "restarts": st["restarts"],
        "restart_events": st["restart_events"],
        "workers": envs.num_workers,
        "envs_per_worker": envs.envs_per_worker,
    }


def progress_bar(enabled: bool, total: int, desc: str):
    """A tqdm bar over env steps, or None when disabled."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", unit_scale=True, dynamic_ncols=True, desc=desc)


def slug(text: str) -> str:
    """``text`` made safe for a directory name (at most 40 characters)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40]
