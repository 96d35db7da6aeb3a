"""Presets: the env's own by default, else its family's (by its spaces), a file of one's own, flags override;
the config records where each value came from."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import pytest

from frugalrl import presets
from frugalrl.algos.ppo import PPOConfig
from frugalrl.batching import MIN_FRAGMENT
from frugalrl.cli import main as cli_main


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
    assert presets.resolve("impala", "Taxi-v4") == ({}, None)  # no preset and no families: the defaults
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


def _cli(capsys, *args: str) -> tuple[int, str]:
    """``frugalrl ARGS`` in this process (a subprocess would spend most of the test importing torch)."""
    capsys.readouterr()
    code = cli_main(list(args))
    return code, capsys.readouterr().err


def test_cli_applies_the_envs_preset_and_flags_win(tmp_path, capsys):
    common = ("--eval-episodes", "1", "--no-progress", "--no-tensorboard", "--no-plots", "--run-dir", str(tmp_path),
              "--backend", "serial")
    code, err = _cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-timesteps", "512", "--gamma", "0.9",
                     "--run-name", "p", *common)
    assert code == 0, err
    assert "preset CartPole-v1" in err
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["preset"] == "CartPole-v1" and config["num_steps"] == 32 and config["gamma"] == 0.9
    code, err = _cli(capsys, "train", "ppo", "--env", "Acrobot-v1", "--preset", "none", "--total-timesteps", "256",
                     "--num-steps", "32", "--run-name", "n", *common)
    assert code == 0, err
    assert json.loads((tmp_path / "n" / "config.json").read_text())["preset"] == "none"
    code, err = _cli(capsys, "train", "ppo", "--env", "MountainCarContinuous-v0", "--total-timesteps", "64",
                     "--num-steps", "16", "--workers", "1", "--envs-per-worker", "2", "--num-minibatches", "1",
                     "--run-name", "m", *common)
    assert code == 0, err
    assert "no ppo preset for MountainCarContinuous-v0; using the family continuous fallback" in err
    assert "  command line: " in err and "  family continuous: " in err
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["preset"] == "family:continuous" and config["update_epochs"] == 10 and config["num_steps"] == 16
    assert config["sources"]["update_epochs"] == "family continuous"
    assert config["sources"]["num_steps"] == "command line"
    # the family's normalisation: observations and the critic's targets, rewards as the env gives them
    assert config["norm_obs"] and config["norm_value"] and not config["norm_reward"] and not config["anneal_lr"]
    assert config["sources"]["norm_value"] == "family continuous"


def test_pipeline_ppo_presets_build_and_vector_envs_need_none():
    """Pipeline PPO's defaults are for any env; its one preset keeps the paper's CarRacing settings."""
    from frugalrl.pipeline import PipelinePPOConfig

    for env in presets.presets("pipeline-ppo"):
        presets.make_config("pipeline-ppo", env).validate()
    car = presets.make_config("pipeline-ppo", PipelinePPOConfig.env)
    assert (car.num_steps, car.num_minibatches, car.update_epochs, car.head_hidden, car.anneal_lr) == (512, 32, 10, 512,
                                                                                                     False)
    assert presets.resolve("pipeline-ppo", "CartPole-v1") == ({}, None)


def test_the_family_is_picked_from_the_spaces():
    from gymnasium import spaces

    vector, frames = spaces.Box(-1, 1, (3,)), spaces.Box(0, 255, (4, 84, 84), dtype="uint8")
    grid = spaces.Box(0, 1, (10, 10, 4), dtype=bool)  # MinAtar's
    assert presets.family_of(vector, spaces.Box(-1, 1, (2,))) == "continuous"
    assert presets.family_of(vector, spaces.Discrete(3)) == "discrete"
    assert presets.family_of(vector, spaces.MultiDiscrete([2, 3])) == "discrete"
    assert presets.family_of(frames, spaces.Discrete(6)) == "image"
    assert presets.family_of(frames, spaces.Box(-1, 1, (3,))) == "image"  # the observations decide first
    assert presets.family_of(grid, spaces.Discrete(6)) == "grid"
    assert presets.resolve("ppo", "MountainCarContinuous-v0")[1] == "family:continuous"
    assert presets.resolve("ppo", "FrozenLake-v1")[1] == "family:discrete"  # one-hot observations: a vector
    assert set(presets.families("ppo")) == {"continuous", "discrete", "image", "grid"}
    values, name = presets.resolve("ppo", "CartPole-v1", "family:image")  # asked for by name
    assert name == "family:image" and values["clip_coef"] == 0.1
    for family in presets.families("ppo"):
        presets.make_config("ppo", "X-v0", f"family:{family}").validate()


def test_an_algorithm_with_one_family_keeps_its_defaults_for_the_others():
    """IMPALA has a fallback for Box actions only: continuous control gets it, other envs IMPALAConfig's defaults,
    an env with a preset its preset."""
    from frugalrl.algos.impala import IMPALAConfig

    assert set(presets.families("impala")) == {"continuous"}
    cfg = presets.make_config("impala", "Pendulum-v1")
    assert isinstance(cfg, IMPALAConfig) and cfg.preset == "family:continuous"
    assert (cfg.envs_per_worker, cfg.num_steps, cfg.update_epochs, cfg.ent_coef, cfg.overlap) == (1, 1024, 10, 0.0,
                                                                                                   False)
    assert cfg.sources["num_steps"] == "family continuous"
    cfg.validate()
    assert presets.resolve("impala", "CartPole-v1") == ({}, None)
    assert presets.make_config("impala", "CartPole-v1").num_steps == IMPALAConfig().num_steps
    assert presets.resolve("impala", "LunarLanderContinuous-v3")[1] == "LunarLanderContinuous-v3"
    with pytest.raises(ValueError, match="unknown impala preset 'family:discrete'"):
        presets.resolve("impala", "CartPole-v1", "family:discrete")


def test_a_preset_and_given_values_win_over_the_family_and_are_recorded():
    cfg = presets.make_config("ppo", "MountainCarContinuous-v0", learning_rate=1e-3)
    assert cfg.preset == "family:continuous" and cfg.update_epochs == 10 and cfg.learning_rate == 1e-3
    assert cfg.sources["learning_rate"] == "argument" and cfg.sources["update_epochs"] == "family continuous"
    assert "gamma" not in cfg.sources  # the family's 0.99 is the default: nothing to say
    assert presets.make_config("ppo", "Pendulum-v1").preset == "Pendulum-v1"  # an env's own preset first
    plain = presets.make_config("ppo", "MountainCarContinuous-v0", "none")
    assert plain.preset == "none" and plain.update_epochs == 4 and plain.sources == {"env": "argument"}
    block = presets.describe(cfg)
    assert block.splitlines()[1].startswith("  family continuous: ") and "update_epochs=10" in block
    assert "  argument: " in block and "learning_rate=0.001" in block


def test_the_cli_prints_the_sources_and_its_help_names_the_family(capsys):
    from frugalrl.cli import _with_preset, main

    cfg = _with_preset("ppo", PPOConfig, {"env": "MountainCarContinuous-v0", "gamma": 0.9})
    err = capsys.readouterr().err
    assert "family continuous: " in err and "  command line: " in err and "gamma=0.9" in err
    assert cfg.sources["gamma"] == "command line" and cfg.sources["num_steps"] == "family continuous"
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--env", "MountainCarContinuous-v0", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "family continuous: 0.0003; without it 0.00025" in out
    assert "else from its family's (continuous, discrete, image" in out


def test_python_and_cli_share_one_path_and_its_notes(caplog, capsys):
    """``make_config`` and ``frugalrl train`` resolve the same way (:func:`presets.configure`): an env that cannot
    be built here gets the class's defaults with a note, logged in Python and printed on the command line."""
    from frugalrl.cli import _with_preset

    with caplog.at_level("INFO", logger="frugalrl.presets"):
        cfg = presets.make_config("ppo", "NoSuchEnv-v0", seed=3)
    assert (cfg.env, cfg.seed, cfg.preset) == ("NoSuchEnv-v0", 3, None)
    assert "cannot build NoSuchEnv-v0 here to choose its family" in caplog.text
    on_cli = _with_preset("ppo", PPOConfig, {"env": "NoSuchEnv-v0", "seed": 3})
    assert (cfg.sources, on_cli.sources) == (dict.fromkeys(("env", "seed"), "argument"),
                                             dict.fromkeys(("env", "seed"), "command line"))
    assert dataclasses.replace(on_cli, sources=cfg.sources) == cfg
    assert "frugalrl: note: cannot build NoSuchEnv-v0" in capsys.readouterr().err


def test_a_config_built_directly_is_told_what_the_command_line_would_set():
    """``PPOConfig(env=X)`` keeps the dataclass's defaults, where ``frugalrl train ppo --env X`` starts from X's
    preset or family: the run logs which values differ; a config from ``make_config`` (or the CLI), one that asks
    for the defaults (``preset='none'``) and one whose values are all the preset's hear nothing."""
    note = presets.hand_built_note("ppo", PPOConfig(env="MountainCarContinuous-v0", gamma=0.9))
    assert note is not None and "its family continuous" in note and "num_steps=" in note
    assert "gamma=" not in note  # a value the user set is theirs
    assert "make_config('ppo', 'MountainCarContinuous-v0', ...)" in note
    assert "the standard Atari preprocessing" in presets.hand_built_note("ppo", PPOConfig(env="ALE/Pong-v5"))
    assert presets.hand_built_note("ppo", presets.make_config("ppo", "MountainCarContinuous-v0")) is None
    assert presets.hand_built_note("ppo", presets.make_config("ppo", "CartPole-v1", preset="none")) is None
    assert presets.hand_built_note("ppo", PPOConfig(env="CartPole-v1", preset="none")) is None
    assert presets.hand_built_note("ppo", PPOConfig(env="NoSuchEnv-v0")) is None  # the run says it cannot build it
    assert presets.hand_built_note("ppo", PPOConfig(env="ALE/NoSuchGame-v5")) is None  # nor its family
    assert presets.hand_built_note("hsa2c", PPOConfig(env="CartPole-v1")) is None  # no preset file: nothing differs
    assert presets.hand_built_note("ppo", PPOConfig(env=lambda: None)) is None  # no command line runs a callable
    with pytest.raises(ValueError, match="^config has fields"):  # the user's field, not the preset's
        presets.make_config("ppo", "CartPole-v1", preset="none", bogus=1)


def test_a_run_of_a_config_built_directly_logs_the_note(caplog, tmp_path):
    from frugalrl.algos.ppo import train

    cfg = PPOConfig(env="CartPole-v1", backend="serial", workers=1, envs_per_worker=2, num_steps=16,
                    total_timesteps=64, eval_episodes=1, run_dir=str(tmp_path), progress=False)
    with caplog.at_level("WARNING", logger="frugalrl"):
        train(cfg)
    assert "PPOConfig was built directly" in caplog.text and "--env CartPole-v1" in caplog.text


def test_an_envs_preset_is_left_for_its_family_where_kwargs_or_wrappers_change_its_spaces():
    """``--env-kwargs`` and ``--env-wrappers`` that change the kinds or sizes of the env's spaces make another task
    than the one its preset was tuned on: the family applies, and the note says why; ones that keep the spaces (a
    time limit) keep the preset, and ``--preset ENV`` asks for it anyway."""
    notes: list[str] = []
    values, name = presets.resolve("ppo", "Acrobot-v1", env_kwargs={"render_mode": "rgb_array"},
                                   env_wrappers=["gymnasium.wrappers.AddRenderObservation"], note=notes.append)
    assert name == "family:image" and values["clip_coef"] == 0.1
    assert len(notes) == 1 and "observes Box(500, 500, 3) uint8 and acts in Discrete(3) there, where" in notes[0]
    assert "Acrobot-v1 itself observes Box(6,) float32" in notes[0] and "--preset Acrobot-v1 applies it" in notes[0]
    frames = presets.resolve("ppo", "CartPole-v1", env_kwargs={"render_mode": "rgb_array"},
                             env_wrappers=["gymnasium.wrappers.AddRenderObservation"])
    assert frames[1] == "family:image"
    assert presets.resolve("ppo", "CartPole-v1", env_kwargs={"max_episode_steps": 100})[1] == "CartPole-v1"
    wrapped = [{"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 20}}]
    assert presets.resolve("ppo", "CartPole-v1", env_wrappers=wrapped)[1] == "CartPole-v1"
    assert presets.resolve("ppo", "Acrobot-v1", "Acrobot-v1", {"render_mode": "rgb_array"},
                           ["gymnasium.wrappers.AddRenderObservation"])[1] == "Acrobot-v1"
    assert presets.space_kind(gym.spaces.Box(-1, 1, (3,))) == presets.space_kind(gym.spaces.Box(-2, 2, (3,)))


def test_an_id_whose_kwargs_make_another_registered_env_gets_that_envs_preset():
    """``LunarLander-v3`` with ``continuous=True`` is ``LunarLanderContinuous-v3`` (the same entry point and
    kwargs): its preset applies, where before the discrete env's did; kwargs that make no registered env with a
    preset keep the id's own preset where the spaces agree (BipedalWalker-v3's hardcore course)."""
    notes: list[str] = []
    values, name = presets.resolve("ppo", "LunarLander-v3", env_kwargs={"continuous": True}, note=notes.append)
    assert name == "LunarLanderContinuous-v3" and values == presets.resolve("ppo", "LunarLanderContinuous-v3")[0]
    assert notes == ["LunarLander-v3 with these env kwargs is LunarLanderContinuous-v3: its ppo preset applies"]
    assert presets.resolve("impala", "LunarLander-v3", env_kwargs={"continuous": True})[1] == "LunarLanderContinuous-v3"
    cfg = presets.make_config("ppo", "LunarLander-v3", env_kwargs={"continuous": True})
    assert cfg.preset == "LunarLanderContinuous-v3" and cfg.sources["gamma"] == "preset LunarLanderContinuous-v3"
    assert presets.registered_as("LunarLander-v3", {"continuous": True, "max_episode_steps": 500}, ["LunarLanderContinuous-v3"]) is None
    assert presets.resolve("ppo", "BipedalWalker-v3", env_kwargs={"hardcore": True})[1] == "BipedalWalker-v3"


def test_more_workers_keep_the_batch_the_preset_was_tuned_with(caplog):
    """--workers or --envs-per-worker without --num-steps: fragments shorten (or lengthen) so that an update learns
    from the tuned batch; at the shortest fragment the batch grows in minibatches of the tuned size; a given
    num_steps, or the tuned worker count, changes nothing. PPO and IMPALA (the dataclass's defaults) alike."""
    tuned = presets.make_config("ppo", "LunarLander-v3")
    assert (tuned.workers, tuned.envs_per_worker, tuned.num_steps, tuned.num_minibatches) == (2, 8, 128, 32)
    with caplog.at_level("INFO", logger="frugalrl.presets"):
        eight = presets.make_config("ppo", "LunarLander-v3", workers=8)
    assert (eight.num_steps, eight.batch_size, eight.num_minibatches) == (32, 2048, 32)
    assert eight.sources["num_steps"] == "batch of preset LunarLander-v3 kept over 8 × 8 envs"
    assert "8 × 8 envs instead of the 2 × 8 of preset LunarLander-v3: 32 steps per env" in caplog.text
    one = presets.make_config("ppo", "LunarLander-v3", workers=1, envs_per_worker=4)
    assert one.batch_size == 2048 and one.num_steps == 512
    many = presets.make_config("ppo", "LunarLander-v3", workers=64)
    assert (many.num_steps, many.batch_size, many.num_minibatches) == (MIN_FRAGMENT, 8192, 128)
    assert presets.make_config("ppo", "LunarLander-v3", workers=64, num_minibatches=4).num_minibatches == 4
    for same in ({"workers": 8, "num_steps": 128}, {"workers": 2}):
        cfg = presets.make_config("ppo", "LunarLander-v3", **same)
        assert cfg.num_steps == 128 and "num_steps" not in cfg.sources
    impala = presets.make_config("impala", "CartPole-v1", workers=4, preset="none")
    defaults = presets.make_config("impala", "CartPole-v1", preset="none")
    assert impala.batch_size == defaults.batch_size and impala.num_steps == defaults.num_steps // 2
    assert impala.sources["num_steps"] == "batch of IMPALAConfig's defaults kept over 4 × 8 envs"
