"""An env that raises: the run stops with its checkpoint (``on_env_error="raise"``, the default) or its worker is
replaced as a dead one is (``"restart"``); the evaluation's env and the algorithms with workers of their own (HSA2C's
DPSGD, split-model PPO's stage 0) stop in one line with the --resume command. Real envs, real worker processes."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from frugalrl import ClusterEnv, make_agent
from frugalrl.envs.restarts import WorkersFailed
from frugalrl.envs.spec import to_env_spec
from frugalrl.envs.worker import WorkerError
from frugalrl.evaluation import EvaluationEnvError, play

pytestmark = pytest.mark.timeout(180)

QUIET = ["--no-progress", "--no-plots", "--no-tensorboard", "--eval-episodes", "1"]


@pytest.mark.parametrize(("mode", "inline"), [("NextStep", 0), ("SameStep", 0), ("NextStep", 1)])
def test_step_replaces_the_worker_whose_env_raised_and_reports_its_envs_truncated(closing, mode, inline):
    """step(): every env raises at the 30th step of its life; with "restart" both workers (one in this process with
    ``inline``) are replaced in that step, which reports all their envs truncated with worker_restarted, and later
    steps go on as usual."""
    env = closing(ClusterEnv("envs_for_tests:RaisesEveryEnv", 2, 2, env_kwargs={"raise_every": 30},
                             on_env_error="restart", autoreset_mode=mode, inline_workers=inline, seed=0))
    env.reset(seed=0)
    restarted = []
    for t in range(1, 45):
        _, _, _, trunc, infos = env.step(np.zeros(4, dtype=np.int64))
        if "worker_restarted" in infos:
            assert trunc.all() and infos["worker_restarted"].all()
            restarted.append(t)
    assert restarted == [30 if mode == "SameStep" else 32]  # NextStep: every 11th step only resets
    events = env.stats()["restart_events"]
    assert sorted(e["worker"] for e in events) == [0, 1]
    assert all(e["reason"].startswith(f"its env {2 * e['worker']} (envs_for_tests:RaisesEveryEnv) raised "
                                      "RuntimeError: simulation unstable at step 30") for e in events)


def test_recv_replaces_the_worker_whose_env_raised(closing):
    """send/recv (EnvPool's API): a worker whose env raised comes back replaced, its envs truncated."""
    env = closing(ClusterEnv("envs_for_tests:RaisesEveryEnv", 2, 1, env_kwargs={"raise_every": 5},
                             on_env_error="restart", inline_workers=0, seed=0))
    env.async_reset(seed=0)
    restarted = []
    for _ in range(16):
        _, _, _, trunc, infos = env.recv(min_workers=2)
        if "worker_restarted" in infos:
            assert trunc[infos["worker_restarted"]].all()
            restarted.append(infos["env_id"][infos["worker_restarted"]].tolist())
        env.send(np.zeros(len(infos["env_id"]), dtype=np.int64), infos["env_id"])
    env.recv(min_workers=2)
    assert restarted and all(ids == [0, 1] for ids in restarted)
    assert env.stats()["restarts"] == 2 * len(restarted)


def test_a_nan_the_env_returns_is_restarted_too(closing):
    env = closing(ClusterEnv("envs_for_tests:NaNObsEnv", 1, 2, env_kwargs={"nan_after": 3}, on_env_error="restart",
                             inline_workers=0, seed=0))
    env.reset(seed=0)
    truncs = [env.step(np.zeros(2, dtype=np.int64))[3].all() for _ in range(8)]
    # NaN at step 3 of each new env; the step after a restart only resets its envs (next-step autoreset)
    assert truncs == [False, False, True, False, False, False, True, False]
    assert "non-finite observation (NaN or inf) from worker 0, env 0" in env.stats()["restart_events"][0]["reason"]


def test_by_default_an_env_that_raises_stops_the_call_naming_the_worker_the_env_and_the_way_on(closing):
    env = closing(ClusterEnv("envs_for_tests:RaisesEveryEnv", 1, 2, env_kwargs={"raise_every": 3}, inline_workers=0))
    env.reset(seed=0)
    env.step(np.zeros(2, dtype=np.int64))
    env.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(WorkerError, match=r"^worker 0: env 0 \(envs_for_tests:RaisesEveryEnv\) raised "
                                          r"RuntimeError: simulation unstable at step 3; on_env_error='restart'"):
        env.step(np.zeros(2, dtype=np.int64))
    assert env.stats()["restarts"] == 0


def test_rollout_collects_the_fragment_again_from_the_replaced_worker(closing):
    env = closing(ClusterEnv("envs_for_tests:RaisesEveryEnv", 2, 1, env_kwargs={"raise_every": 50},
                             on_env_error="restart", inline_workers=1, seed=0))
    agent = make_agent(env.single_observation_space, env.single_action_space, hidden=(8,))
    batches = [env.rollout(agent, 20) for _ in range(4)]  # the third fragment reaches step 50 of both envs
    assert [b.restarted_workers for b in batches] == [[], [], [0, 1], []]
    assert all(b.rewards.shape == (20, 2) and np.isfinite(b.obs).all() for b in batches)
    assert env.stats()["restarts"] == 2


def test_an_env_that_cannot_reset_is_a_crash_loop_given_up_even_when_restarting():
    env = ClusterEnv("envs_for_tests:RaisesOnResetEnv", 1, 1, env_kwargs={"head_pid": os.getpid()},
                     on_env_error="restart", crash_loop_tries=2, inline_workers=0)
    with pytest.raises(WorkersFailed, match=r"worker 0 failed 3 times in a row .*licence server unreachable"):
        env.reset(seed=0)
    assert env.closed


@pytest.mark.parametrize("inline", [0, 1])
def test_a_replacement_whose_env_cannot_be_built_is_a_crash_loop_not_a_crash(tmp_path, inline):
    """The env raises, and its replacement's constructor raises too: the crash-loop rule gives up cleanly (the
    worker process's error at start, and an inline worker's rebuild, are starts that failed)."""
    env = ClusterEnv("envs_for_tests:CannotStartAgainEnv", 1, 1, on_env_error="restart", crash_loop_tries=1,
                     env_kwargs={"head_pid": 0 if inline else os.getpid(), "marker": str(tmp_path / "marker")},
                     inline_workers=inline)  # head_pid 0: it fails in this process too, where an inline worker runs
    env.reset(seed=0)
    for _ in range(4):
        env.step(np.zeros(1, dtype=np.int64))
    with pytest.raises(WorkersFailed, match=r"worker 0 failed 2 times in a row .*licence server unreachable"):
        env.step(np.zeros(1, dtype=np.int64))
    assert env.closed


def test_an_env_of_the_old_gym_api_is_never_restarted(closing):
    env = closing(ClusterEnv("envs_for_tests:OldAPIEnv", 1, 1, backend="serial", env_kwargs={"broken": "reset"},
                             on_env_error="restart"))
    with pytest.raises(WorkerError, match=r"EnvAPIError"):
        env.reset(seed=0)
    assert env.stats()["restarts"] == 0


def test_only_the_envs_own_failures_are_marked_for_a_restart():
    """EnvGroup marks what the env's code raised (with its index) and a NaN it returned (-1: the error names it),
    not Gymnasium's wrappers complaining about an old-API env, nor an interrupt."""
    import gymnasium as gym
    from envs_for_tests import CounterEnv, NaNObsEnv, OldAPIEnv, RaisesEveryEnv

    from frugalrl.experience import EnvGroup, raised_by_env

    class Interrupted(CounterEnv):
        def step(self, action):
            raise KeyboardInterrupt

    def failure(*envs: gym.Env) -> BaseException:
        group = EnvGroup(list(envs))
        group.reset_all(seed=0)
        try:
            for _ in range(5):
                group.step(np.zeros(len(envs), dtype=np.int64))
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            return e
        raise AssertionError("nothing raised")

    assert raised_by_env(failure(CounterEnv(), RaisesEveryEnv(3))) == 1
    assert raised_by_env(failure(NaNObsEnv(nan_after=2), CounterEnv())) == -1
    old = failure(gym.wrappers.TimeLimit(OldAPIEnv(broken="step", after=1), 100))
    assert isinstance(old, ValueError) and raised_by_env(old) is None
    stop = failure(NaNObsEnv(nan_after=1), Interrupted())  # the NaN check does not turn the interrupt into an error
    assert isinstance(stop, KeyboardInterrupt) and raised_by_env(stop) is None


def test_on_env_error_is_checked():
    with pytest.raises(ValueError, match=r"on_env_error must be one of \('raise', 'restart'\), got 'retry'"):
        ClusterEnv("CartPole-v1", 1, backend="serial", on_env_error="retry")  # type: ignore[arg-type]


def test_the_evaluation_plays_an_episode_again_in_a_new_env_or_says_how(caplog):
    """Each env raises at its 30th step: 10-step episodes, so the third episode of each env fails (episodes 2 and
    4 of 5 are played again)."""
    spec = to_env_spec("envs_for_tests:RaisesEveryEnv", {"raise_every": 30})
    agent = make_agent(spec.make().observation_space, spec.make().action_space, hidden=(8,))
    with pytest.raises(EvaluationEnvError, match=r"the evaluation env \(envs_for_tests:RaisesEveryEnv\) raised "
                                                 r"RuntimeError: simulation unstable at step 30; on_env_error="):
        play(agent, spec, 5, seed=0, on_env_error="raise")
    with caplog.at_level(logging.WARNING, logger="frugalrl"):
        returns, cut = play(agent, spec, 5, seed=0, on_env_error="restart")
    assert returns == [10.0] * 5 and cut == 0
    again = [r.getMessage() for r in caplog.records if "again in a new env" in r.getMessage()]
    assert [m.split("playing episode ")[1] for m in again] == ["2 again in a new env", "4 again in a new env"]
    never = to_env_spec("envs_for_tests:RaisesEveryEnv", {"raise_every": 1})
    with pytest.raises(EvaluationEnvError, match=r"raised RuntimeError: simulation unstable at step 1 \(4 times in a"):
        play(agent, never, 2, seed=0, on_env_error="restart", tries=3)  # the first env, then 3 new ones
    with pytest.raises(EvaluationEnvError, match=r"at step 30$"):  # a caller without the setting: no hint
        play(agent, spec, 5, seed=0)


def test_a_ppo_run_with_restart_replaces_the_worker_and_reaches_its_budget(tmp_path, capsys):
    from frugalrl.cli import main as cli_main

    argv = ["train", "ppo", "--env", "envs_for_tests:RaisesOnceEnv", "--preset", "none", "--workers", "1",
            "--envs-per-worker", "1", "--num-steps", "16", "--total-timesteps", "400", "--on-env-error", "restart",
            "--env-kwargs", json.dumps({"marker": str(tmp_path / "marker"), "raise_at": 200}),
            "--run-dir", str(tmp_path), "--run-name", "run", *QUIET]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "budget" and summary["env_steps"] == 400 and summary["restarts"] == 1
    assert "simulation unstable at step 200" in summary["details"]["restart_events"][0]["reason"]
    assert "workers replaced 1 time(s) (the last: worker 0, its env 0 (envs_for_tests:RaisesOnceEnv) raised" in out


def test_an_evaluation_env_that_raises_stops_the_run_cleanly_and_the_final_one_is_a_warning(tmp_path, capsys):
    """Only the evaluation's episodes raise: a scheduled evaluation stops the run with its checkpoint and summary
    and the --resume line; the final one of a run stopped early (by a callback) leaves it saved, its summary saying
    why it was not evaluated."""
    from frugalrl.algos.ppo import PPOConfig, train
    from frugalrl.cli import main as cli_main
    from frugalrl.driver import Callback

    base = ["train", "ppo", "--env", "envs_for_tests:RaisesInEvaluationEnv", "--preset", "none", "--workers", "1",
            "--envs-per-worker", "1", "--num-steps", "16", "--total-timesteps", "64", "--run-dir", str(tmp_path),
            *QUIET]
    assert cli_main([*base, "--run-name", "cadence", "--eval-every", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("frugalrl: error: the evaluation env (envs_for_tests:RaisesInEvaluationEnv) raised "
                              "RuntimeError: rare state reached; on_env_error='restart'"), err
    assert err[-1].endswith(f"frugalrl train ppo --resume {tmp_path / 'cadence'}")
    summary = json.loads((tmp_path / "cadence" / "summary.json").read_text())
    assert summary["stop_reason"] == "worker_error" and summary["env_steps"] == 32
    assert cli_main([*base, "--run-name", "last", "--eval-every", "4"]) == 2  # at its last update
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"the run made all its updates and is saved: frugalrl eval {tmp_path / 'last'} plays its "
                            "policy again"), err  # a resume would have nothing to train

    class StopAtOnce(Callback):
        def on_update(self, run, update, row):
            return False

    cfg = PPOConfig(env="envs_for_tests:RaisesInEvaluationEnv", workers=1, envs_per_worker=1, num_steps=16,
                    total_timesteps=64,
                    run_dir=str(tmp_path), run_name="final", progress=False, plots=False, tensorboard=False,
                    eval_episodes=1, eval_every=0)
    summary = train(cfg, callbacks=[StopAtOnce()])
    assert summary["stop_reason"] == "callback" and summary["env_steps"] == 16 and summary["eval_episodes"] == 0
    assert summary["details"]["warnings"] == ["the end: the evaluation env (envs_for_tests:RaisesInEvaluationEnv) "
                                              "raised RuntimeError: rare state reached; on_env_error='restart' "
                                              "(--on-env-error restart) plays its episode again in a new env"]
    assert (tmp_path / "final" / "checkpoints" / "latest.pt").exists()


def test_a_failed_hsa2c_worker_stops_the_run_in_one_line_and_the_resume_finishes_it(tmp_path, capsys):
    """A DPSGD worker's env raises: the run saves the weights it recorded last and its summary, the CLI prints the
    --resume command (no traceback), and the resume reaches the budget."""
    from frugalrl.cli import main as cli_main

    argv = ["train", "hsa2c", "--env", "envs_for_tests:RaisesOnceEnv", "--workers", "1", "--global-updates", "30",
            "--eval-every", "5",
            "--env-kwargs", json.dumps({"marker": str(tmp_path / "marker"), "raise_at": 300}),
            "--run-dir", str(tmp_path), "--run-name", "run", *QUIET]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("frugalrl: error: DPSGD failed: worker 0: RuntimeError: simulation unstable"), err
    assert err[-1].endswith(f"frugalrl train hsa2c --resume {tmp_path / 'run'}")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "worker_error" and 0 < summary["updates"] < 30
    assert cli_main(["train", "hsa2c", "--resume", str(tmp_path / "run"), "--no-progress"]) == 0
    done = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert done["updates"] == 30
    # resumed again at its budget: nothing left to train, no worker starts, and nothing changes
    assert cli_main(["train", "hsa2c", "--resume", str(tmp_path / "run"), "--no-progress"]) == 0
    again = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (again["updates"], again["env_steps"], again["stop_reason"]) == (30, done["env_steps"], "budget")


@pytest.mark.parametrize("synchronous", [False, True])
def test_an_hsa2c_worker_killed_mid_run_is_replaced_and_the_run_reaches_its_budget(tmp_path, capsys, synchronous):
    """A DPSGD worker process is SIGKILLed once (as by the OOM killer): a new one takes its place (the run's only
    worker, or one of the synchronous baseline's two, whose rounds wait for every worker: the run cannot end without
    it), and the run ends at its budget, counting it."""
    from frugalrl.cli import main as cli_main

    argv = ["train", "hsa2c", "--env", "envs_for_tests:DiesOnceEnv", "--workers", "2" if synchronous else "1",
            "--global-updates", "60",
            "--env-kwargs", json.dumps({"head_pid": os.getpid(), "marker": str(tmp_path / "marker"), "die_at": 20}),
            "--run-dir", str(tmp_path), "--run-name", "run", *QUIET]
    if synchronous:
        argv += ["--synchronous", "--master-batch", "2", "--local-steps", "1"]
    assert cli_main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["updates"] == 60 and summary["restarts"] == 1
    assert summary["details"]["restart_events"][0]["reason"].startswith("process ")  # "process N died (exit ...)"
    assert "workers replaced 1 time(s)" in capsys.readouterr().out


def test_an_hsa2c_worker_that_keeps_dying_is_given_up_in_one_line(tmp_path, capsys):
    from frugalrl.cli import main as cli_main

    argv = ["train", "hsa2c", "--env", "envs_for_tests:DiesAfterEnv", "--workers", "1", "--global-updates", "30",
            "--env-kwargs", json.dumps({"head_pid": os.getpid(), "marker": str(tmp_path / "marker"), "die_after": 100}),
            "--crash-loop-tries", "2", "--run-dir", str(tmp_path), "--run-name", "run", *QUIET]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("frugalrl: error: workers failed: worker 0 failed 3 times in a row with no completed "
                          "request in between (last: process "), err
    assert "--resume" in err  # its checkpoint was saved
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stop_reason"] == "workers_failed"


def test_an_hsa2c_worker_whose_env_raised_is_replaced_with_restart(tmp_path):
    from frugalrl.cli import main as cli_main

    argv = ["train", "hsa2c", "--env", "envs_for_tests:RaisesOnceEnv", "--workers", "1", "--global-updates", "30",
            "--env-kwargs", json.dumps({"marker": str(tmp_path / "marker"), "raise_at": 300}),
            "--on-env-error", "restart", "--run-dir", str(tmp_path), "--run-name", "run", *QUIET]
    assert cli_main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["updates"] == 30 and summary["restarts"] == 1
    assert "simulation unstable at step 300" in summary["details"]["restart_events"][0]["reason"]


@pytest.mark.parametrize("checkpoint_every", [0, 2])
def test_a_failed_pipeline_stage_ends_in_one_line(tmp_path, capsys, checkpoint_every):
    """Stage 0's env raises mid-run: one line; the --resume command where a checkpoint was written before."""
    from frugalrl.cli import main as cli_main

    argv = ["train", "pipeline-ppo", "--env", "envs_for_tests:RaisesOnceEnv", "--num-envs", "1", "--num-steps", "16",
            "--total-timesteps", "400", "--checkpoint-every", str(checkpoint_every),
            "--env-kwargs", json.dumps({"marker": str(tmp_path / "marker"), "raise_at": 100}),
            "--run-dir", str(tmp_path), "--run-name", "run", *QUIET]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("frugalrl: error: pipeline stage 0 failed: RuntimeError: simulation unstable at step"
                              " 100"), err
    assert err[-1].endswith(f"--resume {tmp_path / 'run'}") == bool(checkpoint_every)


def test_the_restart_rule_travels_from_the_config(closing):
    from frugalrl.algos.ppo import PPOConfig

    env = closing(ClusterEnv.from_config(PPOConfig(env="CartPole-v1", workers=1, backend="serial",
                                                   on_env_error="restart")))
    assert env.on_env_error == "restart"
