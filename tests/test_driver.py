"""The one loop: an algorithm written against :class:`frugalrl.driver.Algorithm` alone gets the evaluation
schedule, the target stop, checkpoints, an exact resume, user callbacks and the summary from the driver.

The toy is hill climbing on CartPole: each update perturbs the policy's weights with its seeded generator and
keeps the perturbation when an episode scores at least as well. It has no loop, no evaluation and no
checkpoint code of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import gymnasium as gym
import pytest
import torch

from frugalrl import algos
from frugalrl.config import RunConfig
from frugalrl.driver import Algorithm, Callback, Setup, Step, Update, drive
from frugalrl.envs.spec import to_env_spec
from frugalrl.evaluation import Evaluation, policy_evaluator
from frugalrl.nets import make_agent
from frugalrl.runs import RunSummary, read_metrics
from frugalrl.training import RunRecorder


@dataclass(kw_only=True)
class ToyConfig(RunConfig):
    """The toy's knobs: the run's plus a noise scale."""

    noise: float = 0.05
    """Standard deviation of each weight perturbation."""


class Best:
    """The best episode return so far, as a checkpoint part."""

    def __init__(self) -> None:
        self.value = -1.0

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


class HillClimb(Algorithm):
    """Perturb, play one episode, keep what is not worse."""

    name = "toy"

    def setup(self) -> Setup:
        self.env = gym.make("CartPole-v1")
        self.agent = make_agent(self.env.observation_space, self.env.action_space)
        self.generator = torch.Generator().manual_seed(self.cfg.seed)
        self.best = Best()
        spec = to_env_spec("CartPole-v1", {})
        return Setup({"agent": self.agent, "generator": self.generator, "best": self.best}, total_updates=self.cfg.total_timesteps // 50,
                     steps_per_update=50, evaluate=policy_evaluator(self.agent, spec, self.cfg))

    def update(self, step: Step) -> Update:
        vector = torch.nn.utils.parameters_to_vector(self.agent.parameters())
        trial = vector + self.cfg.noise * torch.randn(vector.shape, generator=self.generator)
        torch.nn.utils.vector_to_parameters(trial, self.agent.parameters())
        obs, _ = self.env.reset(seed=int(torch.randint(2**31, (1,), generator=self.generator)))
        total, steps, done = 0.0, 0, False
        while not done and steps < 50:  # one episode of at most 50 steps: the update's env steps
            with torch.no_grad():
                logits = self.agent.dist_params(torch.as_tensor(obs, dtype=torch.float32)[None])
            obs, reward, terminated, truncated, _ = self.env.step(int(logits.argmax()))
            total, steps, done = total + float(reward), steps + 1, terminated or truncated
        if total >= self.best.value:
            self.best.value = total
        else:
            torch.nn.utils.vector_to_parameters(vector, self.agent.parameters())
        return Update(50, {"toy/best": self.best.value}, episode_returns=[total])

    def close(self) -> None:
        self.env.close()


def _config(tmp_path, **overrides) -> ToyConfig:
    settings = {"run_dir": str(tmp_path), "run_name": "toy", "progress": False, "tensorboard": False, "plots": False,
                "eval_episodes": 2, "eval_every": 4, "total_timesteps": 800, "checkpoint_every": 5,
                "eval_stochastic": False}
    return ToyConfig(**{**settings, **overrides})


def _weights(summary) -> torch.Tensor:
    ckpt = torch.load(f"{summary['run_dir']}/checkpoints/latest.pt", weights_only=False)
    return torch.cat([v.reshape(-1) for _, v in sorted(ckpt["parts"]["agent"].items())])


def test_a_toy_algorithm_gets_evaluation_checkpoints_and_the_summary(tmp_path):
    summary = drive(HillClimb(_config(tmp_path)))
    assert set(summary) == {f.name for f in dataclasses.fields(RunSummary)}
    assert summary["algo"] == "toy" and summary["updates"] == 16 and summary["env_steps"] == 800
    assert [e["step"] for e in summary["eval_history"]] == [200, 400, 600, 800]  # every 4 updates and the last
    assert summary["stop_reason"] == "budget" and summary["eval_episodes"] == 2
    rows = read_metrics(summary["run_dir"])
    assert [r["step"] for r in rows if "toy/best" in r] == list(range(50, 801, 50))
    assert all("charts/sps" in r for r in rows if "toy/best" in r)  # the driver's standard columns
    assert (tmp_path / "toy" / "checkpoints" / "best.pt").exists()
    assert json.loads((tmp_path / "toy" / "config.json").read_text())["noise"] == 0.05


def test_a_toy_run_resumed_from_its_checkpoint_ends_where_an_uninterrupted_one_does(tmp_path):
    """Stopped by a callback after 7 updates (the stop writes its checkpoint), resumed to the whole budget: the
    same weights as one uninterrupted run, because the driver restores every part and the RNG states."""
    whole = drive(HillClimb(_config(tmp_path / "whole")))

    class StopAt(Callback):
        def on_update(self, run, update, row):
            return run.updates < 7

    cut = drive(HillClimb(_config(tmp_path / "cut", checkpoint_every=5)), callbacks=[StopAt()])
    assert cut["stop_reason"] == "callback" and cut["updates"] == 7
    resumed = drive(HillClimb(_config(tmp_path / "cut")), resume=cut["run_dir"])
    assert resumed["updates"] == 16 and [r["step"] for r in resumed["resumes"]] == [350]
    assert torch.equal(_weights(resumed), _weights(whole))


def test_checkpoints_come_by_time_and_after_each_best_evaluation(tmp_path, monkeypatch):
    """``checkpoint_every_s``: a checkpoint after every update that starts that long after the last one, and after
    every evaluation that is the run's best so far; None: only at the end (``checkpoint_every`` 0)."""
    saves: list[int] = []
    save = RunRecorder.save

    def counted(run: RunRecorder):
        saves.append(run.updates)
        return save(run)

    monkeypatch.setattr(RunRecorder, "save", counted)
    drive(HillClimb(_config(tmp_path / "end", checkpoint_every=0, checkpoint_every_s=None)))
    assert saves == [16]
    saves.clear()
    summary = drive(HillClimb(_config(tmp_path / "best", checkpoint_every=0, checkpoint_every_s=1e9)))
    means = [e["mean"] for e in summary["eval_history"][:-1]]  # the last one is the end's
    bests = [4 * (i + 1) for i, m in enumerate(means) if all(m > earlier for earlier in means[:i])]
    assert bests and saves == [*bests, 16]
    saves.clear()
    drive(HillClimb(_config(tmp_path / "time", checkpoint_every=0, checkpoint_every_s=1e-9)))
    assert saves == [*range(1, 16), 16]  # due before every update (the last one's is the end's)


def test_callbacks_see_every_update_and_evaluation_and_a_target_stops_the_run(tmp_path):
    seen = {"updates": 0, "evaluations": []}

    class Count(Callback):
        def on_update(self, run, update, row):
            seen["updates"] += 1

        def on_evaluation(self, run, evaluation):
            seen["evaluations"].append(evaluation.mean)

    summary = drive(HillClimb(_config(tmp_path, eval_every=1, target_return=1.0)), callbacks=[Count()])
    assert summary["stop_reason"] == "target_return" and summary["updates"] == 1  # any policy scores >= 1
    assert seen == {"updates": 1, "evaluations": [summary["eval_return_mean"]]}
    assert summary["time_to_target"]["step"] == 50


def test_an_algorithm_that_misses_a_required_part_is_named():
    class NoUpdate(Algorithm):
        name = "broken"

        def setup(self) -> Setup:
            raise AssertionError("never built")

    with pytest.raises(TypeError, match="update"):
        NoUpdate(RunConfig())  # type: ignore[abstract]


def test_a_registered_toy_is_scored_by_frugalrl_eval(tmp_path, monkeypatch):
    """One registry line makes the toy's run directory something ``frugalrl eval`` scores."""
    summary = drive(HillClimb(_config(tmp_path, total_timesteps=200)))
    monkeypatch.setitem(algos.ALGORITHMS, "toy", algos.Registered("test_driver", "ToyConfig", "hill climbing"))
    agent, counters = algos.load_policy(summary["run_dir"])
    assert counters["env_steps"] == 200 and not agent.training
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from frugalrl import algos, cli; "
            "algos.ALGORITHMS['toy'] = algos.Registered('test_driver', 'ToyConfig', 'hill climbing'); "
            "cli.main(['eval', sys.argv[2], '--episodes', '2'])")
    out = subprocess.run([sys.executable, "-c", code, str(__import__("pathlib").Path(__file__).parent),
                          summary["run_dir"]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["algo"] == "toy"


class SignalAt(Callback):
    """Sends this process ``signum`` (``times`` times) after update ``at``, as a scheduler would."""

    def __init__(self, at: int, signum: int = signal.SIGTERM, times: int = 1) -> None:
        self.at, self.signum, self.times = at, signum, times

    def on_update(self, run, update, row):
        if run.updates == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum, reason", [(signal.SIGTERM, "preempted"), (signal.SIGINT, "interrupted")])
def test_a_signal_stops_the_run_with_a_checkpoint_and_a_resume_finishes_it_exactly(tmp_path, signum, reason):
    """SIGTERM (or SIGINT) mid-run: the update in progress completes, the checkpoint and summary are written with the
    signal's stop reason and no final evaluation, the handlers are given back; resumed, the run ends where an
    uninterrupted one does."""
    whole = drive(HillClimb(_config(tmp_path / "whole")))
    # As a terminal delivers it: a shell's background job (CI may run pytest so) inherits SIGINT ignored, and an
    # ignored signal stays ignored by the driver.
    inherited = signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    before = signal.getsignal(signum)
    cut = drive(HillClimb(_config(tmp_path / "cut")), callbacks=[SignalAt(6, signum)])
    assert signal.getsignal(signum) is before
    signal.signal(signum, inherited)
    assert cut["stop_reason"] == reason and cut["updates"] == 6 and cut["env_steps"] == 300
    assert [e["step"] for e in cut["eval_history"]] == [200]  # the schedule's; none made for the stop
    assert torch.load(tmp_path / "cut" / "toy" / "checkpoints" / "latest.pt",
                      weights_only=False)["counters"]["env_steps"] == 300
    resumed = drive(HillClimb(_config(tmp_path / "cut")), resume=cut["run_dir"])
    assert resumed["stop_reason"] == "budget" and resumed["env_steps"] == 800
    assert torch.equal(_weights(resumed), _weights(whole))


class SignalledLate(HillClimb):
    """A signal that comes while the algorithm is told whether the run goes on (as it may while a remote half is
    told, e.g. pipeline PPO's stage 1)."""

    def start(self) -> None:
        self.told: list[bool] = []

    def after_update(self, stopping: bool, saved: bool) -> None:
        self.told.append(stopping)
        if self.run.updates == 4:
            os.kill(os.getpid(), signal.SIGTERM)


def test_the_run_ends_only_after_telling_the_algorithm_it_stops(tmp_path):
    """A signal after the stop check of an update's turn is the next update's: the loop never ends on a signal
    the algorithm was not told of (a remote half would wait for an update that never comes)."""
    inherited = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        algo = SignalledLate(_config(tmp_path))
        summary = drive(algo)
    finally:
        signal.signal(signal.SIGTERM, inherited)
    assert summary["stop_reason"] == "preempted" and summary["updates"] == 5
    assert algo.told == [False] * 4 + [True]


def test_a_second_signal_exits_at_once(tmp_path):
    inherited = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        drive(HillClimb(_config(tmp_path)), callbacks=[SignalAt(3, times=2)])
    assert stop.value.code == 128 + signal.SIGTERM and signal.getsignal(signal.SIGTERM) is before
    signal.signal(signal.SIGTERM, inherited)


def test_an_ignored_signal_stays_ignored(tmp_path):
    """``nohup``-style or background-job runs that inherit a signal ignored keep ignoring it."""
    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        summary = drive(HillClimb(_config(tmp_path)), callbacks=[SignalAt(3, signal.SIGINT)])
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert summary["stop_reason"] == "budget" and summary["updates"] == 16


SIGNAL_AT_EVAL_STEP: list[int] = []
"""The evaluation env step at which :func:`_signalling_cartpole` envs send SIGTERM once (empty: never)."""


def _signalling_cartpole() -> gym.Env:
    """CartPole that sends this process SIGTERM at the evaluation step in :data:`SIGNAL_AT_EVAL_STEP`, once: a
    scheduler's preemption that lands while an evaluation plays."""
    steps = [0]

    class Signalling(gym.Wrapper):
        def step(self, action):
            steps[0] += 1
            if SIGNAL_AT_EVAL_STEP and steps[0] == SIGNAL_AT_EVAL_STEP[0]:
                SIGNAL_AT_EVAL_STEP.clear()
                os.kill(os.getpid(), signal.SIGTERM)
            return super().step(action)

    return Signalling(gym.make("CartPole-v1"))


class SlowEvaluation(HillClimb):
    """The toy, evaluated on :func:`_signalling_cartpole` envs with many episodes (a slow env's evaluation)."""

    def setup(self) -> Setup:
        setup = super().setup()
        setup.evaluate = policy_evaluator(self.agent, to_env_spec(_signalling_cartpole, {}), self.cfg)
        return setup


@pytest.mark.parametrize("eval_every, stopped_at", [(0, 16), (4, 4)])
def test_a_signal_during_an_evaluation_saves_at_once_and_the_resume_evaluates(tmp_path, eval_every, stopped_at):
    """SIGTERM while the final evaluation (or a scheduled one) plays: the evaluation stops within its episode, the
    run is saved without it (its training is on disk before the final one starts), with the signal's stop reason;
    the resumed run evaluates and ends where an uninterrupted one does."""
    overrides = {"eval_every": eval_every, "eval_episodes": 50, "checkpoint_every": 0}
    whole = drive(HillClimb(_config(tmp_path / "whole", **overrides)))
    inherited = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        SIGNAL_AT_EVAL_STEP[:] = [30]
        cut = drive(SlowEvaluation(_config(tmp_path / "cut", **overrides)))
    finally:
        SIGNAL_AT_EVAL_STEP.clear()
        signal.signal(signal.SIGTERM, inherited)
    assert cut["stop_reason"] == "preempted" and cut["updates"] == stopped_at
    assert cut["eval_history"] == [] and cut["eval_episodes"] == 0  # the cut evaluation is not recorded
    assert torch.load(f"{cut['run_dir']}/checkpoints/latest.pt", weights_only=False)["counters"]["updates"] == stopped_at
    resumed = drive(HillClimb(_config(tmp_path / "cut", **overrides)), resume=cut["run_dir"])
    assert resumed["stop_reason"] == "budget" and resumed["updates"] == 16
    assert resumed["eval_history"][-1]["step"] == 800 and resumed["eval_episodes"] == 50
    assert torch.equal(_weights(resumed), _weights(whole))


def test_a_resume_right_after_the_last_evaluation_reports_it(tmp_path):
    """A run resumed from a checkpoint taken at its last evaluation (here: a finished run resumed again) does not
    evaluate again, and its summary reports that evaluation rather than none."""
    first = drive(HillClimb(_config(tmp_path)))
    again = drive(HillClimb(_config(tmp_path)), resume=first["run_dir"])
    assert again["eval_history"] == first["eval_history"] and again["eval_episodes"] == 2
    assert again["eval_return_mean"] == first["eval_return_mean"]


class SampledToo(HillClimb):
    """The toy with a sampling evaluation beside each deterministic one (as PPO's and IMPALA's), counted."""

    played = 0

    def setup(self) -> Setup:
        setup = super().setup()
        sampling = policy_evaluator(self.agent, to_env_spec("CartPole-v1", {}), self.cfg, deterministic=False)

        def counted() -> Evaluation:
            SampledToo.played += 1
            return sampling()

        setup.evaluate_stochastic = counted
        return setup


def test_a_resume_right_after_the_last_evaluation_does_not_play_its_sampling_one_again(tmp_path):
    SampledToo.played = 0
    first = drive(SampledToo(_config(tmp_path)))
    assert first["stochastic_return_mean"] is not None and SampledToo.played == 1
    again = drive(SampledToo(_config(tmp_path)), resume=first["run_dir"])
    assert again["stochastic_return_mean"] == first["stochastic_return_mean"] and SampledToo.played == 1


def test_a_run_planned_for_few_updates_says_so(tmp_path, caplog):
    """64 workers on a two-worker preset make each update 32× larger: a budget of a handful of updates is said."""
    with caplog.at_level("WARNING", logger="frugalrl"):
        drive(HillClimb(_config(tmp_path, total_timesteps=150)))
    notes = [r.getMessage() for r in caplog.records if "this budget makes" in r.getMessage()]
    assert notes == ["frugalrl: note: this budget makes 3 updates of 50 env steps: the policy learns once an update, "
                     "and more workers (or envs per worker, or steps per rollout) make each one larger; a larger "
                     "--total-timesteps gives more"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="frugalrl"):
        drive(HillClimb(_config(tmp_path / "more")))  # 16 updates
    assert not [r for r in caplog.records if "this budget makes" in r.getMessage()]
