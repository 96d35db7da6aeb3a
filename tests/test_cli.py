"""The command line as a user runs it: train, eval, plots; Ctrl-C and a killed head leave no workers behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY = ["--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "2", "--num-steps", "32",
        "--progress", "false"]


def _frugalrl(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frugalrl.cli", *args], capture_output=True, text=True,
                          timeout=180, **kw)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.timeout(200)
def test_train_eval_plots(tmp_path):
    done = _frugalrl("train", "ppo", *TINY, "--total-timesteps", "2048", "--sync", "aaps",
                     "--run-dir", str(tmp_path), "--run-name", "tiny")
    assert done.returncode == 0, done.stderr
    assert "weight syncs" in done.stdout
    summary = json.loads((tmp_path / "tiny" / "summary.json").read_text())
    assert summary["details"]["sync_rule"] == "aaps(0.05, lag<=4)"  # the guard: a quarter of 16 updates
    assert summary["env_steps"] == 2048
    config = json.loads((tmp_path / "tiny" / "config.json").read_text())
    assert config["workers"] == 2 and config["sync"] == "aaps"
    again = _frugalrl("train", "ppo", *TINY, "--total-timesteps", "2048", "--run-dir", str(tmp_path), "--run-name", "tiny")
    assert again.returncode == 2 and f"{tmp_path / 'tiny'} already holds a run: continue it with  frugalrl train ppo " \
        f"--resume {tmp_path / 'tiny'}" in again.stderr  # the first run's checkpoints are not written over
    assert json.loads((tmp_path / "tiny" / "summary.json").read_text()) == summary

    ev = _frugalrl("eval", str(tmp_path / "tiny"), "--episodes", "2")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["episodes"] == 2
    threads = _frugalrl("eval", str(tmp_path / "tiny"), "--torch-threads", "0")
    assert threads.returncode == 2 and "--torch-threads must be a positive integer" in threads.stderr

    for video in ("agent.mp4", "agent.gif"):  # the same episodes, recorded: one frame per reset and per step
        rec = _frugalrl("eval", str(tmp_path / "tiny"), "--episodes", "2", "--video", str(tmp_path / video))
        assert rec.returncode == 0, rec.stderr
        played = json.loads(rec.stdout)
        assert played["returns"] == json.loads(ev.stdout)["returns"]
        frames = int(sum(played["returns"])) + 2  # CartPole pays 1 per step
        assert f"{frames} frames of 2 episodes written to" in rec.stderr
        assert _frames(tmp_path / video) == frames * (1 if video.endswith(".mp4") else 20)
    bad = _frugalrl("eval", str(tmp_path / "tiny"), "--video", str(tmp_path / "agent.avi"))
    assert bad.returncode == 2 and "a video is written as .mp4 or .gif" in bad.stderr

    pl = _frugalrl("plots", str(tmp_path / "tiny"))
    assert pl.returncode == 0 and "bytes_by_kind.png" in pl.stdout


def test_a_video_scales_small_float_frames_up_and_leaves_nothing_on_failure(tmp_path):
    """MinAtar renders 10 × 10 frames of floats in [0, 1]: they become uint8 blocks of 16 × 16 pixels. A recording
    that fails leaves neither the file nor its temporary copy."""
    import numpy as np

    from frugalrl.video import Frames, VideoError

    frames = Frames(tmp_path / "grid.mp4", fps=20)
    for v in (0.0, 0.5, 1.0):
        frames.add(np.full((10, 10, 3), v))
    frames.close(keep=True)
    assert frames.count == 3 and _frames(tmp_path / "grid.mp4") == 3
    import cv2

    capture = cv2.VideoCapture(str(tmp_path / "grid.mp4"))
    assert int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)) == 160
    capture.release()
    broken = Frames(tmp_path / "broken.gif", fps=20)
    broken.add(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(VideoError, match=r"render\(\) gave None, not an RGB frame"):
        broken.add(None)
    broken.close(keep=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.mp4"]


def test_a_gif_too_large_for_memory_stops_with_one_line(tmp_path, monkeypatch):
    """A GIF's frames stay in memory until it is written: past ``GIF_MAX_BYTES`` the recording stops and says to
    write an MP4, leaving no file."""
    import numpy as np

    from frugalrl import video

    monkeypatch.setattr(video, "GIF_MAX_BYTES", 3 * 160 * 160)
    frames = video.Frames(tmp_path / "long.gif", fps=20)
    for _ in range(3):
        frames.add(np.zeros((160, 160, 3), np.uint8))
    with pytest.raises(video.VideoError, match=r"4 frames of 160 × 160 exceed .* GiB; write an \.mp4"):
        frames.add(np.zeros((160, 160, 3), np.uint8))
    frames.close(keep=False)
    assert frames.count == 3 and not list(tmp_path.iterdir())


def _frames(path: Path) -> int:
    """The frames of an MP4 (through OpenCV); a GIF's milliseconds (through Pillow, which writes a frame like the last
    one as a longer last one)."""
    if path.suffix == ".gif":
        from PIL import Image, ImageSequence

        with Image.open(path) as gif:
            return sum(int(frame.info["duration"]) for frame in ImageSequence.Iterator(gif))
    import cv2

    capture = cv2.VideoCapture(str(path))
    try:
        return int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    finally:
        capture.release()


def test_bad_flags_give_clear_errors(tmp_path):
    bad_env = _frugalrl("train", "ppo", *TINY, "--env", "NoSuchEnv-v0", "--run-dir", str(tmp_path))
    assert bad_env.returncode == 2 and "NoSuchEnv-v0" in bad_env.stderr
    bad_value = _frugalrl("train", "ppo", *TINY, "--num-steps", "0", "--run-dir", str(tmp_path))
    assert bad_value.returncode == 2 and "num_steps" in bad_value.stderr
    bad_type = _frugalrl("train", "ppo", "--workers", "two")
    assert bad_type.returncode == 2 and "workers" in bad_type.stderr
    not_a_run = _frugalrl("eval", str(tmp_path))
    assert not_a_run.returncode == 2 and "not a run directory" in not_a_run.stderr


def _start_training(tmp_path) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "frugalrl.cli", "train", "ppo", *TINY, "--total-timesteps", "10000000",
         "--inline-workers", "0", "--run-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # Ctrl-C as a terminal delivers it: a shell's background job (`cmd &` without job control, as CI scripts
        # may run pytest) inherits SIGINT ignored, and a Python started so keeps ignoring it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    workers: list[int] = []
    while time.monotonic() < deadline and len(workers) < 2:
        time.sleep(0.2)
        workers = _children(proc.pid)
    assert len(workers) >= 2, "workers did not start"
    # Wait until training is under way (the run directory's metrics file has a row).
    while time.monotonic() < deadline:
        metrics = list(Path(tmp_path).glob("*/metrics.jsonl"))
        if metrics and metrics[0].read_text().strip():
            break
        time.sleep(0.2)
    return proc, workers


@pytest.mark.timeout(120)
def test_ctrl_c_stops_training_and_its_workers(tmp_path):
    """Ctrl-C stops the run after the update in progress: checkpoint and summary ("interrupted"), the ``--resume``
    line, exit 0 (a stop on request), workers gone. (A second one exits at once: tests/test_driver.py.)"""
    proc, workers = _start_training(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "interrupted" in err and "--resume" in err
    assert "Traceback" not in err
    assert _wait_gone(workers, 5) == []
    summary = json.loads(next(Path(tmp_path).glob("*/summary.json")).read_text())
    assert summary["stop_reason"] == "interrupted"


@pytest.mark.timeout(120)
def test_killed_head_leaves_no_orphans(tmp_path):
    proc, workers = _start_training(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    # Workers poll for their parent once a second.
    assert _wait_gone(workers, 10) == [], "workers outlived a SIGKILLed head"


@pytest.mark.timeout(120)
def test_env_factory_defined_in_the_users_script(tmp_path):
    """A factory from the user's __main__ works on the local backend; the script's guarded code runs once."""
    script = tmp_path / "user_script.py"
    script.write_text(
        "import gymnasium as gym\n"
        "from frugalrl import ClusterEnv\n"
        "def make():\n"
        "    return gym.make('CartPole-v1')\n"
        "if __name__ == '__main__':\n"
        "    print('main ran')\n"
        "    env = ClusterEnv(make, num_workers=1, envs_per_worker=2, backend='local', seed=0)\n"
        "    print('obs', env.reset(seed=0)[0].shape)\n"
        "    env.close()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("main ran") == 1
    assert "obs (2, 4)" in done.stdout


def _console_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``frugalrl ...`` as the installed console script runs: the working directory is not on the import path
    (``-I``; ``python -m`` would put it there)."""
    code = "import sys; from frugalrl.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-I", "-c", code, *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd)


@pytest.mark.timeout(200)
def test_an_env_module_in_the_working_directory_trains_and_evaluates(tmp_path):
    """``frugalrl train ppo --env mymodule:MyEnv-v0`` from the folder that holds ``mymodule.py`` (Gymnasium's
    ``module:EnvId``: the import registers the id) trains, and ``frugalrl eval`` plays it; a module found nowhere
    says where to put it, in train and in eval."""
    (tmp_path / "userenvs.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('UserCartPole-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',"
        " max_episode_steps=30)\n"
    )
    flags = ["--workers", "2", "--envs-per-worker", "2", "--num-steps", "32", "--progress", "false"]
    done = _console_script("train", "ppo", "--env", "userenvs:UserCartPole-v0", *flags, "--total-timesteps", "256",
                           "--run-dir", "runs", "--run-name", "user", "--eval-episodes", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    played = _console_script("eval", "runs/user", "--episodes", "2", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    assert json.loads(played.stdout)["return_mean"] <= 30  # the registered 30-step limit
    missing = _console_script("train", "ppo", "--env", "nosuchmodule:make", *flags, cwd=tmp_path)
    assert missing.returncode == 2 and "PYTHONPATH" in missing.stderr.splitlines()[-1]
    (tmp_path / "elsewhere").mkdir()  # eval where the env's module cannot be imported: one line too
    away = _console_script("eval", str(tmp_path / "runs" / "user"), "--episodes", "1", cwd=tmp_path / "elsewhere")
    assert away.returncode == 2 and away.stderr.splitlines()[-1].startswith("frugalrl: error: cannot import module "
                                                                            "'userenvs'"), away.stderr


def test_eval_plays_fresh_episodes_by_default():
    """``frugalrl eval``'s first env seed is evaluation.FRESH_SEED (written out: the CLI does not import torch)."""
    from frugalrl.cli import build_parser
    from frugalrl.evaluation import EVAL_SEED, FRESH_SEED, RECHECK_SEED

    assert build_parser().parse_args(["eval", "run"]).seed == FRESH_SEED
    assert len({EVAL_SEED, FRESH_SEED, RECHECK_SEED}) == 3


def test_help_shows_the_defaults_the_env_preset_takes_effect_with(capsys):
    """``train ALGO --env X --help`` shows X's preset value beside the dataclass default; without a preset, the
    dataclass default alone."""
    import pytest

    from frugalrl.cli import main

    with pytest.raises(SystemExit):
        main(["train", "ppo", "--env", "LunarLander-v3", "--help"])
    assert "preset LunarLander-v3: 0.0005; without it 0.00025" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--env", "NoPreset-v0", "--preset", "none", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Adam step size. (default: 0.00025)" in out and "preset" not in out.split("--learning-rate")[2][:80]


def test_an_atari_id_trains_on_preprocessed_frames(capsys):
    """`frugalrl train ppo --env ALE/Pong-v5` gets rl-zoo's treatment of Atari ids: the standard preprocessing, hence
    the Nature-CNN and the image family; `--env-kwargs` (even `{}`) keeps the raw env."""
    from frugalrl.algos.ppo import PPOConfig
    from frugalrl.cli import _with_preset
    from frugalrl.envs.spec import to_env_spec
    from frugalrl.presets import ATARI_FACTORY, make_config

    cfg = _with_preset("ppo", PPOConfig, {"env": "ALE/Pong-v5"})
    assert (cfg.env, cfg.env_kwargs) == (ATARI_FACTORY, {"env_id": "ALE/Pong-v5"})
    assert "standard Atari preprocessing" in capsys.readouterr().err
    in_python = make_config("ppo", "ALE/Pong-v5")  # the Python --preset: the same config
    assert (in_python.env, in_python.env_kwargs, in_python.preset) == (cfg.env, cfg.env_kwargs, cfg.preset)
    raw = _with_preset("ppo", PPOConfig, {"env": "ALE/Pong-v5", "env_kwargs": {}})
    assert (raw.env, raw.env_kwargs) == ("ALE/Pong-v5", {})
    assert _with_preset("ppo", PPOConfig, {"env": "CartPole-v1"}).env == "CartPole-v1"
    # SB3's, rl-zoo's and CleanRL's Atari ids: no frame skip of their own, no sticky actions (v4's)
    legacy = _with_preset("ppo", PPOConfig, {"env": "BreakoutNoFrameskip-v4"})
    assert (legacy.env, legacy.env_kwargs) == (ATARI_FACTORY, {"env_id": "BreakoutNoFrameskip-v4"})
    env = to_env_spec(legacy.env, legacy.env_kwargs).make()
    try:
        assert env.observation_space.shape == (4, 84, 84)
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    finally:
        env.close()


def test_env_wrappers_choose_the_family_train_and_evaluate_the_wrapped_env(tmp_path):
    """``--env-wrappers``: the family fallback reads the wrapped env's spaces (minigrid's Dict observations become an
    image under ImgObsWrapper: the grid family), and training and evaluation both play the wrapped env (a 20-step
    TimeLimit caps CartPole's returns at 20); config.json keeps the wrappers for ``eval`` and ``--resume``."""
    from frugalrl.algos.ppo import PPOConfig
    from frugalrl.cli import _with_preset

    pytest.importorskip("minigrid")
    grid = _with_preset("ppo", PPOConfig, {"env": "MiniGrid-Empty-5x5-v0",
                                           "env_wrappers": ["minigrid.wrappers.ImgObsWrapper"]})
    assert grid.preset == "family:grid"
    wrappers = '[{"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 20}}]'
    done = _frugalrl("train", "ppo", *TINY, "--env-wrappers", wrappers, "--total-timesteps", "2048",
                     "--run-dir", str(tmp_path), "--run-name", "capped", "--eval-episodes", "3")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "capped" / "summary.json").read_text())
    assert summary["eval_return_mean"] <= 20 and summary["train_return_mean_last100"] <= 20
    config = json.loads((tmp_path / "capped" / "config.json").read_text())
    assert config["env_wrappers"] == [{"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 20}}]
    played = _frugalrl("eval", str(tmp_path / "capped"), "--episodes", "2")
    assert played.returncode == 0, played.stderr
    assert json.loads(played.stdout)["return_mean"] <= 20


def test_version_names_frugalrl_and_the_libraries_it_runs_on(capsys):
    from frugalrl import __version__
    from frugalrl.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert re.fullmatch(rf"frugalrl {re.escape(__version__)} \(python 3\.\S+, torch \S+, gymnasium \S+, numpy \S+\)\n",
                        capsys.readouterr().out)


@pytest.mark.parametrize("given", ['{"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 20}}',
                                   '[{"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 20}}]'])
def test_env_wrappers_take_one_json_object_as_the_help_shows_it_or_a_list(given):
    from frugalrl.cli import build_parser

    args = build_parser(["train", "ppo"]).parse_args(["train", "ppo", "--env-wrappers", given])
    assert args.env_wrappers == [{"gymnasium.wrappers:TimeLimit": {"max_episode_steps": 20}}]
    words = build_parser(["train", "ppo"]).parse_args(["train", "ppo", "--env-wrappers", "a:B,c.D"])
    assert words.env_wrappers == ["a:B", "c.D"]


def test_the_summary_shows_syncs_per_worker_briefly_when_workers_are_many():
    from frugalrl.summary_text import per_worker as _per_worker

    assert _per_worker([], 0) == ""
    assert _per_worker([4] * 64, 256) == " (4 per worker)"
    assert _per_worker([3, 5], 8) == " (per worker [3, 5])"
    assert _per_worker([5, 3, 4, 4, 4, 6, 4, 4, 4], 38) == " (per worker 3 to 6, median 4)"
    assert _per_worker([3, 5], 20) == " (per worker since the resume on 2 workers [3, 5])"  # resumed on fewer


def test_a_run_stopped_before_its_final_evaluation_says_so_not_nan():
    from frugalrl.summary_text import evaluation_line as _evaluation_line

    stopped = {"eval_episodes": 0, "eval_return_mean": float("nan"), "eval_return_std": float("nan"),
               "eval_history": [{"step": 4096, "mean": 123.45}]}
    assert _evaluation_line(stopped, "deterministic") == "  not evaluated at the end: the last one 123.5 at step 4096"
    assert _evaluation_line({**stopped, "eval_history": []}, "deterministic") == "  not evaluated at the end"
    done = {"eval_episodes": 2, "eval_return_mean": 10.0, "eval_return_std": 1.0}
    assert _evaluation_line(done, "deterministic") == "  evaluation return 10.0 ± 1.0 (2 deterministic episodes)"
