"""One contract over every registered algorithm: the same summary keys, a run directory that `frugalrl eval`
scores, and a run that `--resume` continues to a larger budget without logging a step twice."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from frugalrl.algos import ALGORITHMS, algorithm, resume
from frugalrl.runs import RunSummary, read_metrics

QUIET = {"progress": False, "tensorboard": False, "plots": False, "eval_episodes": 2}

# A tiny CartPole run of each algorithm, and how to make it longer (a resumed run's larger budget).
TINY: dict[str, tuple[dict, dict]] = {
    "ppo": ({"backend": "serial", "workers": 1, "envs_per_worker": 2, "num_steps": 16, "total_timesteps": 64},
            {"total_timesteps": 128}),
    "impala": ({"backend": "serial", "workers": 1, "envs_per_worker": 2, "num_steps": 8, "total_timesteps": 32,
                "overlap": False}, {"total_timesteps": 64}),
    "pipeline-ppo": ({"num_envs": 2, "num_steps": 16, "num_minibatches": 2, "update_epochs": 1,
                      "total_timesteps": 32, "head_hidden": 16, "warmup_timesteps": 0}, {"total_timesteps": 64}),
    "hsa2c": ({"workers": 1, "local_steps": 2, "global_updates": 3, "eval_every": 1, "envs_per_process": 2},
              {"global_updates": 6}),
}


def test_every_algorithm_is_in_the_contract():
    assert set(TINY) == set(ALGORITHMS), "add a tiny CartPole run of the new algorithm to TINY"


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_runs_through_the_driver(name):
    """What a registered algorithm's module must have: an Algorithm subclass registered under its name (the driver
    runs it), and ``train(cfg, resume=None, callbacks=())``."""
    import inspect

    from frugalrl.driver import Algorithm

    mod, cls = algorithm(name).load()
    assert dataclasses.is_dataclass(cls), f"{name}: its config must be a dataclass (its fields are the CLI flags)"
    own = [c for c in Algorithm.__subclasses__() if getattr(c, "name", None) == name and c.__module__.startswith("frugalrl.")]
    assert len(own) == 1, f"{name}: no frugalrl.driver.Algorithm subclass with name = {name!r} in {mod.__name__}"
    params = inspect.signature(mod.train).parameters
    assert {"resume", "callbacks"} <= set(params), f"{name}: train() must take resume= and callbacks="


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(TINY))
def test_run_directory_contract(tmp_path, name):
    mod, cls = algorithm(name).load()
    settings, longer = TINY[name]
    cfg = cls(**{**QUIET, **settings}, run_dir=str(tmp_path), run_name="run", env="CartPole-v1")
    first = mod.train(cfg)
    assert set(first) == {f.name for f in dataclasses.fields(RunSummary)}
    assert first["algo"] == name and first["env_id"] == "CartPole-v1" and first["updates"] >= 1
    assert first["eval_episodes"] == 2 and first["eval_deterministic"]
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["algo"] == name

    ev = subprocess.run([sys.executable, "-m", "frugalrl.cli", "eval", str(run), "--episodes", "2"],
                        capture_output=True, text=True, timeout=120)
    assert ev.returncode == 0, ev.stderr
    scored = json.loads(ev.stdout)
    assert scored["algo"] == name and scored["episodes"] == 2 and scored["return_mean"] > 0

    second = resume(run, **longer)
    assert second["updates"] > first["updates"] and second["env_steps"] > first["env_steps"]
    assert [r["step"] for r in second["resumes"]] == [first["env_steps"]]
    # HSA2C's rows are its server's evaluations, at estimated steps; its final evaluation (a row of its own,
    # with a std) is at the exact step count, which an estimate can equal.
    rows = [r for r in read_metrics(run) if not (name == "hsa2c" and "eval/return_std" in r)]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), steps


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(TINY))
def test_every_algorithm_trains_on_an_env_with_tuple_observations(tmp_path, name):
    """Blackjack's observations are a Tuple of Discretes: every algorithm gets them flattened to one Box, with no
    flag, as SB3's preprocessing does."""
    mod, cls = algorithm(name).load()
    settings, _ = TINY[name]
    cfg = cls(**{**QUIET, **settings, "eval_episodes": 1}, run_dir=str(tmp_path), run_name="run", env="Blackjack-v1")
    summary = mod.train(cfg)
    assert summary["env_id"] == "Blackjack-v1" and summary["updates"] >= 1 and summary["eval_episodes"] == 1
