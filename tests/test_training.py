"""The training loop's own checks: an evaluation that contradicts the training curve is named, and so is a run
that ends clearly below its best evaluation (whose policy ``checkpoints/best.pt`` keeps). The runs are driven by
:func:`frugalrl.driver.drive` with a scripted algorithm whose updates are given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch

from frugalrl.driver import Algorithm, Setup, Step, Update, drive
from frugalrl.evaluation import Evaluation, evaluation_disagreement, evaluation_regression, regression_recheck


class Scripted(Algorithm):
    """Updates that are given: each runs its ``before`` (e.g. changes the agent's weights), then reports its env
    steps and episode returns. Named "ppo": ``load_policy``'s generic path reads its run directory."""

    name = "ppo"

    def __init__(self, cfg, updates: list[tuple[Callable[[Any], None], int, list[float]]], parts=None,
                 evaluate=None, evaluate_stochastic=None) -> None:
        super().__init__(cfg)
        self.updates, self.parts = updates, parts or {}
        self.evaluate, self.evaluate_stochastic = evaluate, evaluate_stochastic

    def setup(self) -> Setup:
        return Setup(self.parts, total_updates=len(self.updates), steps_per_update=10, evaluate=self.evaluate,
                     evaluate_stochastic=self.evaluate_stochastic)

    def update(self, step: Step) -> Update:
        before, steps, returns = self.updates[step.index - 1]
        before(self.run)
        return Update(steps, episode_returns=returns)


def _nothing(run) -> None:
    return None


def test_a_greedy_policy_that_fails_is_flagged():
    # Acrobot-v1 without normalisation under AAPS: training episodes −94, the mode never reaches the goal.
    out = evaluation_disagreement(Evaluation(-500.0, 0.0, 10), Evaluation(-97.0, 8.0, 10, False), -94.0)
    assert out is not None and "mode does not do what its samples do" in out["message"]


def test_stale_or_lossy_actors_are_flagged():
    out = evaluation_disagreement(Evaluation(-150.0, 9.0, 10), Evaluation(-120.0, 30.0, 10, False), -480.0)
    assert out is not None and "stale or lossy actors" in out["message"]


def test_agreement_passes():
    assert evaluation_disagreement(Evaluation(250.0, 20.0, 10), Evaluation(230.0, 40.0, 10, False), 210.0) is None
    assert evaluation_disagreement(Evaluation(500.0, 0.0, 10), None, 480.0) is None
    assert evaluation_disagreement(None, None, 10.0) is None


def test_each_evaluation_records_both_modes_and_the_training_return(tmp_path):
    """The cadence's history entries carry the stochastic return, the training return of the moment, and a
    disagreement when they contradict each other; the summary reuses the last step's stochastic evaluation."""
    from frugalrl.config import RunConfig

    cfg = RunConfig(run_dir=str(tmp_path), progress=False, tensorboard=False, plots=False, eval_every=1)
    calls = {"det": 0, "sto": 0}

    def det() -> Evaluation:
        calls["det"] += 1
        return Evaluation(-500.0, 0.0, 10)

    def sto() -> Evaluation:
        calls["sto"] += 1
        return Evaluation(-100.0, 20.0, 10, False)

    history = []
    algo = Scripted(cfg, [(_nothing, 10, [-90.0, -110.0, -95.0, -105.0, -100.0]),
                          (lambda run: history.extend(run.eval_history), 10, [-100.0] * 5)],
                    evaluate=det, evaluate_stochastic=sto)
    summary = drive(algo)
    first = history[0]
    assert (first["mean"], first["stochastic_mean"], first["train_return"]) == (-500.0, -100.0, -100.0)
    assert "mode does not do what its samples do" in first["disagreement"]
    assert calls == {"det": 2, "sto": 2}  # the final evaluation is the last cadence's, both modes
    assert summary["stochastic_return_mean"] == -100.0
    assert summary["eval_disagreement"]["earlier_evaluations"] == [10]


def test_the_check_reads_the_late_training_episodes_only(tmp_path):
    """A short run, or one of long episodes: the last 100 episodes reach back to the first policy. The check takes
    those of the run's last fifth, and needs five of them."""
    from frugalrl.config import RunConfig

    def run(updates: list[tuple[Callable[[Any], None], int, list[float]]]) -> dict:
        cfg = RunConfig(run_dir=str(tmp_path), progress=False, tensorboard=False, plots=False)
        return drive(Scripted(cfg, updates, evaluate=lambda: Evaluation(30.0, 1.0, 10),
                              evaluate_stochastic=lambda: Evaluation(31.0, 1.0, 10, False)))

    learned = run([(_nothing, 10, [0.0] * 20)] * 8 + [(_nothing, 10, [30.0] * 5)] * 2)  # the last fifth at 30
    assert learned["eval_disagreement"] is None
    few = run([(_nothing, 10, [0.0] * 20)] * 8 + [(_nothing, 10, []), (_nothing, 10, [5.0] * 4)])  # 4: too few
    assert few["eval_disagreement"] is None
    stale = run([(_nothing, 10, [0.0] * 20)] * 8 + [(_nothing, 10, [-300.0] * 5)] * 2)  # late episodes contradict
    assert "stale or lossy actors" in stale["eval_disagreement"]["message"]


def test_noise_around_zero_is_not_a_disagreement():
    """LunarLander hovering: 20 points apart, near zero, with episodes spread ± 30: the spread sets the scale."""
    assert evaluation_disagreement(Evaluation(-6.9, 30.0, 10), Evaluation(0.0, 25.0, 10, False), 20.6) is None


def _entry(step: int, mean: float, std: float = 0.0, episodes: int = 10) -> dict:
    return {"step": step, "mean": mean, "std": std, "episodes": episodes}


def test_a_collapse_after_the_best_evaluation_is_named():
    """LunarLander HSA2C seed 1 (hsa2c_vs_sync_average): 10-episode checks peaked at 259, the final scored 167."""
    history = [_entry(0, -600.0, 100.0), _entry(10, 259.0, 20.0), _entry(20, 228.0, 40.0), _entry(30, 167.0, 90.0)]
    out = evaluation_regression(history)
    assert out is not None and (out["best"], out["best_step"], out["final"]) == (259.0, 10, 167.0)
    assert "got worse after its best evaluation" in out["message"] and out["drop"] == 92.0


def test_noise_below_the_best_is_not_a_collapse():
    # the best of many noisy checks is the luckiest: a final 30 below it, episodes spread ± 60, is noise
    assert evaluation_regression([_entry(0, 280.0, 40.0), _entry(1, 250.0, 60.0)]) is None
    # within 10% of the best, whatever the spread
    assert evaluation_regression([_entry(0, 500.0), _entry(1, 460.0)]) is None
    # deterministic returns (CartPole at its cap, then not): a 20% drop is no noise
    assert evaluation_regression([_entry(0, 500.0), _entry(1, 400.0)]) is not None
    # the final is the best, or the only evaluation
    assert evaluation_regression([_entry(0, 100.0, 5.0), _entry(1, 200.0, 5.0)]) is None
    assert evaluation_regression([_entry(0, 100.0, 5.0)]) is None


def test_one_episode_checks_borrow_the_final_spread():
    """HSA2C's default cadence checks are one greedy episode with no spread: a lucky episode 120 above a final
    whose episodes spread ± 100 is not a collapse; one 400 above it is."""
    assert evaluation_regression([_entry(0, 250.0, 0.0, 1), _entry(1, 130.0, 100.0)]) is None
    assert evaluation_regression([_entry(0, 250.0, 0.0, 1), _entry(1, -150.0, 100.0)]) is not None


def test_a_drop_of_nothing_is_no_regression():
    """A policy stuck at a return of about 0 with no spread (HSA2C standing still on MountainCarContinuous-v0) once
    warned that it "got worse" from -0.0 to -0.0; a drop below ``MIN_DROP`` is none, one above it still counts."""
    assert evaluation_regression([_entry(0, -1e-5, 0.0), _entry(1, -2e-5, 0.0)]) is None
    assert evaluation_regression([_entry(0, 1.0, 0.0), _entry(1, 0.5, 0.0)]) is not None
    stuck = regression_recheck(Evaluation(-1e-5, 0.0, 3, returns=[-1e-5] * 3),
                               Evaluation(-2e-5, 0.0, 3, returns=[-2e-5] * 3))
    assert not stuck["confirmed"]


def test_best_policy_is_kept_and_a_run_that_ends_below_it_says_so(tmp_path, caplog):
    """A run whose third evaluation falls far below its second: best.pt holds the weights evaluated second, the
    summary names the drop and points to best.pt, and ``load_policy(run, "best")`` gives that policy back."""
    from frugalrl.algos import load_policy
    from frugalrl.config import RunConfig
    from frugalrl.nets import make_agent

    env = gym.make("CartPole-v1")
    agent = make_agent(env.observation_space, env.action_space)
    cfg = RunConfig(run_dir=str(tmp_path), progress=False, tensorboard=False, plots=False, eval_every=1,
                    eval_stochastic=False)
    scores = iter([Evaluation(20.0, 5.0, 10), Evaluation(480.0, 10.0, 10), Evaluation(150.0, 60.0, 10)])
    weights = []

    def step(run) -> None:
        with torch.no_grad():
            for p in agent.parameters():
                p.add_(0.1)
        weights.append(torch.nn.utils.parameters_to_vector(agent.parameters()).clone())

    with caplog.at_level("WARNING", logger="frugalrl"):
        summary = drive(Scripted(cfg, [(step, 10, [])] * 3, parts={"agent": agent}, evaluate=lambda: next(scores)))
    reg = summary["eval_regression"]
    assert (reg["best"], reg["best_step"], reg["final"]) == (480.0, 20, 150.0)
    assert "checkpoints/best.pt" in reg["message"] and "--checkpoint best" in reg["message"]
    assert "got worse after its best evaluation" in caplog.text
    best, counters = load_policy(summary["run_dir"], "best")
    assert torch.equal(torch.nn.utils.parameters_to_vector(best.parameters()), weights[1])
    assert counters["env_steps"] == 20 and counters["evaluation"]["mean"] == 480.0
    latest, _ = load_policy(summary["run_dir"])
    assert torch.equal(torch.nn.utils.parameters_to_vector(latest.parameters()), weights[2])


def test_a_recheck_confirms_only_a_drop_that_repeats_on_fresh_episodes():
    """Both policies on the same fresh episodes: a drop well beyond the paired differences' noise is confirmed; one
    that the fresh episodes do not show, or that is within their noise, is not."""
    def ev(returns: list[float]) -> Evaluation:
        t = torch.tensor(returns)
        return Evaluation(float(t.mean()), float(t.std(unbiased=False)), len(returns), returns=returns)

    real = regression_recheck(ev([250.0, 260.0, 240.0, 255.0]), ev([120.0, 150.0, 90.0, 130.0]))
    assert real["confirmed"] and real["drop"] == 128.75 and "fresh episodes" in real["message"]
    assert not regression_recheck(ev([250.0, 260.0, 240.0, 255.0]), ev([245.0, 262.0, 238.0, 250.0]))["confirmed"]
    # paired: each episode 40 below, the mean drop 40 against a best of 250 (16%): confirmed; shuffled noise: not
    assert regression_recheck(ev([250.0, 150.0, 350.0, 250.0]), ev([210.0, 110.0, 310.0, 210.0]))["confirmed"]
    assert not regression_recheck(ev([250.0, 150.0, 350.0, 250.0]), ev([310.0, 110.0, 210.0, 210.0]))["confirmed"]


def _cartpole_run(tmp_path, good_best: bool):
    """A CartPole run whose cadence check recorded 480 for the weights it held (a hand-set policy that balances the
    pole if ``good_best``, else the untrained one), then ends with the untrained weights, evaluated for real."""
    from frugalrl.config import RunConfig
    from frugalrl.envs.spec import to_env_spec
    from frugalrl.evaluation import policy_evaluator
    from frugalrl.nets import make_agent

    env = gym.make("CartPole-v1")
    agent = make_agent(env.observation_space, env.action_space)
    untrained = {k: v.clone() for k, v in agent.state_dict().items()}
    cfg = RunConfig(run_dir=str(tmp_path), progress=False, tensorboard=False, plots=False, eval_every=0)

    def update(run) -> None:
        if good_best:  # push towards the side the pole falls to: θ + θ'/2 > 0 → right
            with torch.no_grad():
                for p in agent.actor.parameters():
                    p.zero_()
                agent.actor[0].weight[0, 2:] = torch.tensor([1.0, 0.5])
                agent.actor[2].weight[0, 0] = 1.0
                agent.actor[4].weight[1, 0], agent.actor[4].weight[0, 0] = 1.0, -1.0
        run.record_eval(Evaluation(480.0, 10.0, 10), step=10, seconds=0.0)  # writes best.pt with the weights held now
        agent.load_state_dict(untrained)

    evaluate = policy_evaluator(agent, to_env_spec("CartPole-v1", {}), cfg)
    return drive(Scripted(cfg, [(update, 20, [])], parts={"agent": agent}, evaluate=evaluate))


def test_a_lucky_best_evaluation_is_not_a_collapse(tmp_path, caplog):
    """The best check recorded 480 for the same weights that end the run: on fresh episodes the two score the
    same, so the run does not warn (it logs why)."""
    with caplog.at_level("INFO", logger="frugalrl"):
        summary = _cartpole_run(tmp_path, good_best=False)
    assert summary["eval_return_mean"] < 100 and summary["eval_regression"] is None
    assert "the best one was lucky" in caplog.text and "got worse" not in caplog.text


def test_a_collapse_that_fresh_episodes_confirm_is_reported(tmp_path, caplog):
    """best.pt balances the pole, the final policy does not: the fresh episodes confirm the drop, and the warning
    carries their scores."""
    with caplog.at_level("WARNING", logger="frugalrl"):
        summary = _cartpole_run(tmp_path, good_best=True)
    reg = summary["eval_regression"]
    assert reg is not None and reg["recheck"]["confirmed"] and reg["recheck"]["episodes"] == 10
    assert reg["recheck"]["best"] == 500.0 and reg["recheck"]["final"] < 100
    assert "fresh episodes" in reg["message"] and "got worse" in caplog.text


def test_evaluation_episodes_that_never_end_are_cut_and_the_run_says_so(tmp_path, caplog):
    """An env without a time limit of its own (a counter truncated only after 10⁹ steps): each evaluation episode
    stops at ``eval_max_steps`` with its return so far, the history counts the cut episodes (deterministic and
    sampling), and the run warns once; episodes that end before the cap are not counted."""
    from frugalrl.algos.ppo import PPOConfig, train

    base = dict(env="envs_for_tests:CounterEnv", preset="none", workers=1, envs_per_worker=2, num_steps=16,
                num_minibatches=1, total_timesteps=64, eval_episodes=2, eval_max_steps=30, backend="serial",
                run_dir=str(tmp_path), progress=False, tensorboard=False, plots=False)
    with caplog.at_level("WARNING"):
        s = train(PPOConfig(**base, env_kwargs={"horizon": 10**9}, run_name="endless"))
    assert s["eval_return_mean"] == 30.0 and s["stochastic_return_mean"] == 30.0  # reward 1 per step
    assert s["eval_history"][-1]["cut_episodes"] == 4
    warnings = [r.getMessage() for r in caplog.records if "eval_max_steps=30" in r.getMessage()]
    assert len(warnings) == 1 and "4 of 4 evaluation episodes" in warnings[0]
    ended = train(PPOConfig(**base, env_kwargs={"horizon": 20}, run_name="ended"))
    assert ended["eval_return_mean"] == 20.0 and "cut_episodes" not in ended["eval_history"][-1]


def test_a_budget_that_is_not_whole_iterations_is_said_and_kept_exact(tmp_path, caplog):
    """PPO takes whole iterations (workers × envs × steps): a budget below one runs one, another is rounded down,
    and the run says how many env steps it takes; a whole budget says nothing."""
    from frugalrl.algos.ppo import PPOConfig, train

    base = dict(env="CartPole-v1", preset="none", workers=1, envs_per_worker=2, num_steps=16, num_minibatches=1,
                eval_episodes=0, backend="serial", run_dir=str(tmp_path), progress=False, tensorboard=False,
                plots=False)
    for total, taken in ((10, 32), (100, 96), (64, 64)):
        caplog.clear()
        with caplog.at_level("WARNING"):
            s = train(PPOConfig(**base, total_timesteps=total, run_name=f"t{total}"))
        notes = [r.getMessage() for r in caplog.records if "not a whole number" in r.getMessage()]
        assert s["env_steps"] == taken
        assert notes == ([] if total == taken else [f"frugalrl: note: total_timesteps={total} is not a whole number "
                                                    f"of 32-step iterations: the run takes {taken} env steps "
                                                    f"({taken // 32} iteration{'' if taken == 32 else 's'})"])


def test_update_rows_thinned_by_time_keep_evaluations_the_end_and_every_episode(tmp_path, caplog, monkeypatch):
    """With ``log_every_s``, an update's row is written after that long, with an evaluation and at the end; the
    training return of a written row is that of every episode since the last one. With 0, every update has its
    row, and a run whose files grow fast is told once of the setting."""
    import json
    import logging

    from frugalrl import runs
    from frugalrl.config import RunConfig

    returns = [[1.0, 2.0], [3.0], [], [4.0, 5.0, 6.0], [7.0], [8.0]]

    def rows(every_s: float) -> list[dict]:
        cfg = RunConfig(run_dir=str(tmp_path), progress=False, tensorboard=False, plots=False, eval_every=3,
                        eval_stochastic=False, log_every_s=every_s, run_name=f"every-{every_s}")
        drive(Scripted(cfg, [(_nothing, 10, r) for r in returns], evaluate=lambda: Evaluation(5.0, 1.0, 10)))
        lines = (tmp_path / f"every-{every_s}" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    thinned = rows(1e6)
    assert [r["step"] for r in thinned] == [10, 30, 60]  # the first, then the two with an evaluation (the last)
    assert [r["train/episode_return"] for r in thinned] == [1.5, 3.0, 6.0]
    assert all("eval/return_mean" in r for r in thinned[1:])

    # A checkpoint writes the row held back (a resume starts after it); an event column is written at once.
    cfg = RunConfig(run_dir=str(tmp_path), progress=False, tensorboard=False, plots=False, eval_episodes=0,
                    checkpoint_every=2, log_every_s=1e6, run_name="events")


    class FaultAtFive(Scripted):
        def update(self, step: Step) -> Update:
            done = super().update(step)
            if step.index == 5:
                done.row["faults/restarted_workers"] = 1
            return done

    drive(FaultAtFive(cfg, [(_nothing, 10, r) for r in returns]))
    events = [json.loads(line) for line in (tmp_path / "events" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in events] == [10, 20, 40, 50, 60]  # first, checkpoints at 2 and 4, the fault, the end
    assert [r.get("train/episode_return") for r in events] == [1.5, 3.0, 5.0, 7.0, 8.0]
    assert "faults/restarted_workers" in events[3]

    monkeypatch.setattr(runs, "GROWTH_AFTER_S", 0.0)
    monkeypatch.setattr(runs, "GROWTH_MB_PER_HOUR", 0.0)
    with caplog.at_level(logging.WARNING, logger="frugalrl"):
        every = rows(0.0)
    assert [r["step"] for r in every] == [10, 20, 30, 40, 50, 60]
    assert [r.get("train/episode_return") for r in every] == [1.5, 3.0, None, 5.0, 7.0, 8.0]
    told = [m for m in caplog.messages if "--log-every-s 1" in m]
    assert len(told) == 1 and "MB an hour" in told[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="frugalrl"):
        rows(1e-9)  # thinned at all: not told
    assert not [m for m in caplog.messages if "--log-every-s" in m]
