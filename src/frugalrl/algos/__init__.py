"""The algorithms, registered in one table: what ``frugalrl train``, ``frugalrl eval`` and resume look up.

Every algorithm module has a dataclass config (its fields are the CLI flags), an
:class:`~frugalrl.driver.Algorithm` subclass that :func:`~frugalrl.driver.drive` runs, ``train(cfg, resume=None)``
returning the run summary, and may have ``load_policy(run_dir)`` when its checkpoint is not one agent (the
split-model pipeline); otherwise the checkpoint's ``agent`` part is the policy.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger("frugalrl")


@dataclass(frozen=True)
class Registered:
    """Where a registered algorithm lives and what it is."""

    module: str
    config: str
    help: str
    ray_flag: str | None = "--backend"
    """The flag that puts its workers on Ray (``frugalrl slurm`` adds it with ``--ray-address``); None: none."""

    def load(self) -> tuple[Any, type]:
        """The algorithm's module and its config class."""
        mod = importlib.import_module(self.module)
        return mod, getattr(mod, self.config)


ALGORITHMS: dict[str, Registered] = {
    "ppo": Registered("frugalrl.algos.ppo", "PPOConfig",
                     "PPO on ClusterEnv: workers act with their copy of the policy, AAPS decides when it is refreshed"),
    "impala": Registered("frugalrl.algos.impala", "IMPALAConfig",
                        "AcceRL: V-trace learner, actors running a compressed policy, a Monitor tuning compression"),
    "pipeline-ppo": Registered("frugalrl.pipeline", "PipelinePPOConfig",
                              "split-model PPO over torch.distributed with sparse, accumulated cut gradients",
                              ray_flag=None),
    "hsa2c": Registered("frugalrl.algos.hsa2c", "HSA2CConfig",
                       "A2C optimised by DPSGD: a parameter server and lock-free Hogwild workers",
                       ray_flag="--transport"),
}


def algorithm(name: str) -> Registered:
    """The registered algorithm ``name`` (``ValueError`` listing the known ones otherwise)."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}") from None


def resume(run_dir: str | Path, **overrides: Any) -> dict[str, Any]:
    """Continue the run in ``run_dir`` from its latest checkpoint with the config it was started with
    (``overrides``: fields to change, e.g. a larger ``total_timesteps``); returns the summary.

    The Python equivalent of ``frugalrl train ALGO --resume RUN_DIR``.
    """
    from frugalrl.runs import read_config

    saved = read_config(run_dir)
    mod, cls = algorithm(saved.get("algo", "")).load()
    return mod.train(resumed_config(run_dir, cls, saved, overrides, "resume() override", log.info), resume=run_dir)


def resumed_config(run_dir: str | Path, cls: type, saved: dict[str, Any], overrides: dict[str, Any], source: str,
                   note: Callable[[str], object]) -> Any:
    """The config a resumed run goes on with: the one it was started with (``saved``, its ``config.json``) and
    ``overrides``, recorded as from ``source``; on other workers, the batch it ran with (``note`` hears how).
    ``frugalrl train --resume`` and :func:`resume` build it here."""
    from frugalrl.batching import keep_batch_on_resume
    from frugalrl.config import config_from_dict

    sources = {**saved.get("sources", {}), **dict.fromkeys(overrides, source)}
    cfg = config_from_dict(cls, {**saved, **overrides, "sources": sources}, where=f"{run_dir}/config.json")
    keep_batch_on_resume(cfg, saved, overrides, note)
    return cfg


def load_policy(run_dir: str | Path, checkpoint: Literal["latest", "best"] = "latest") -> tuple[Any, dict[str, Any]]:
    """The policy a run directory's ``latest`` checkpoint (or its ``best``-evaluated one, ``checkpoints/best.pt``)
    holds, ready to act (``eval()`` mode), and the checkpoint's counters. Works for every algorithm's run directory
    (``best``: those with one agent; the split pipeline model keeps none)."""
    from frugalrl.nets import build_policy
    from frugalrl.runs import BEST, CHECKPOINT, read_checkpoint, read_config

    if checkpoint not in ("latest", "best"):
        raise ValueError(f"checkpoint must be 'latest' or 'best', got {checkpoint!r}")
    mod, _ = algorithm(read_config(run_dir).get("algo", "")).load()
    if hasattr(mod, "load_policy") and checkpoint == "latest":
        return mod.load_policy(run_dir)
    payload = read_checkpoint(run_dir, CHECKPOINT if checkpoint == "latest" else BEST)
    agent = build_policy(payload["spec"])
    agent.load_state_dict(payload["parts"]["agent"])
    agent.eval()
    return agent, payload["counters"]
