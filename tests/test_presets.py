"""Presets: the env's own by default, a note when there is none, a file of one's own, flags override."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from frugalrl import presets
from frugalrl.algos.ppo import PPOConfig


def test_every_preset_builds_a_valid_config():
    table = presets.presets("ppo")
    assert {"CartPole-v1", "LunarLander-v3", "HalfCheetah-v5", "Walker2d-v5", "BipedalWalker-v3"} <= set(table)
    for env in table:
        cfg = presets.make_config("ppo", env)
        assert isinstance(cfg, PPOConfig) and cfg.preset == env
        cfg.validate()


def test_resolve_auto_none_name_and_file(tmp_path):
    values, name = presets.resolve("ppo", "LunarLander-v3")
    assert name == "LunarLander-v3" and values["gamma"] == 0.999 and "_source" not in values
    assert presets.resolve("ppo", "Taxi-v3") == ({}, None)
    assert presets.resolve("ppo", "LunarLander-v3", "none") == ({}, None)
    assert presets.resolve("ppo", "MyEnv-v0", "CartPole-v1")[0]["num_steps"] == 32
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"MyEnv-v0": {"gamma": 0.9}, "Other-v0": {"gamma": 0.5}}))
    assert presets.resolve("ppo", "MyEnv-v0", str(mine)) == ({"gamma": 0.9}, str(mine))
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"learning_rate": 0.01}))
    assert presets.resolve("ppo", "X-v0", str(flat))[0] == {"learning_rate": 0.01}
    with pytest.raises(ValueError, match="unknown ppo preset 'nope'"):
        presets.resolve("ppo", "X-v0", "nope")


def test_cli_applies_the_envs_preset_and_flags_win(tmp_path):
    done = subprocess.run([sys.executable, "-m", "frugalrl.cli", "train", "ppo", "--env", "CartPole-v1",
                           "--total-timesteps", "512", "--gamma", "0.9", "--eval-episodes", "1", "--no-progress",
                           "--run-dir", str(tmp_path), "--run-name", "p", "--backend", "serial"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "preset CartPole-v1" in done.stderr
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["preset"] == "CartPole-v1" and config["num_steps"] == 32 and config["gamma"] == 0.9
    none = subprocess.run([sys.executable, "-m", "frugalrl.cli", "train", "ppo", "--env", "Acrobot-v1",
                           "--preset", "none", "--total-timesteps", "256", "--num-steps", "32", "--eval-episodes", "1",
                           "--no-progress", "--run-dir", str(tmp_path), "--run-name", "n", "--backend", "serial"],
                          capture_output=True, text=True, timeout=120)
    assert none.returncode == 0, none.stderr
    assert json.loads((tmp_path / "n" / "config.json").read_text())["preset"] is None
    missing = subprocess.run([sys.executable, "-m", "frugalrl.cli", "train", "ppo", "--env", "MountainCarContinuous-v0",
                              "--total-timesteps", "64", "--num-steps", "16", "--workers", "1", "--envs-per-worker", "2",
                              "--num-minibatches", "1", "--eval-episodes", "1", "--no-progress", "--run-dir",
                              str(tmp_path), "--run-name", "m", "--backend", "serial"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 0, missing.stderr
    assert "no ppo preset for MountainCarContinuous-v0" in missing.stderr


def test_pipeline_ppo_presets_build_and_vector_envs_need_none():
    """Pipeline PPO's defaults are for any env; its one preset keeps the paper's CarRacing settings."""
    from frugalrl.pipeline import PipelinePPOConfig

    for env in presets.presets("pipeline-ppo"):
        presets.make_config("pipeline-ppo", env).validate()
    car = presets.make_config("pipeline-ppo", PipelinePPOConfig.env)
    assert (car.num_steps, car.num_minibatches, car.update_epochs, car.head_hidden, car.anneal_lr) == (512, 32, 10, 512,
                                                                                                     False)
    assert presets.resolve("pipeline-ppo", "CartPole-v1") == ({}, None)
