"""The training loop's own checks: an evaluation that contradicts the training curve is named."""

from __future__ import annotations

from frugalrl.evaluation import Evaluation, evaluation_disagreement


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
    from frugalrl.training import Training

    cfg = RunConfig(run_dir=str(tmp_path), progress=False, tensorboard=False, plots=False, eval_every=1)
    calls = {"det": 0, "sto": 0}

    def det() -> Evaluation:
        calls["det"] += 1
        return Evaluation(-500.0, 0.0, 10)

    def sto() -> Evaluation:
        calls["sto"] += 1
        return Evaluation(-100.0, 20.0, 10, False)

    run = Training("test", cfg)
    run.begin(det, total_steps=20, total_updates=2, evaluate_stochastic=sto)
    run.update(10, {}, episode_returns=[-90.0, -110.0])
    first = run.eval_history[0]
    assert (first["mean"], first["stochastic_mean"], first["train_return"]) == (-500.0, -100.0, -100.0)
    assert "mode does not do what its samples do" in first["disagreement"]
    run.update(10, {}, episode_returns=[-100.0])
    summary = run.finish()
    assert calls == {"det": 2, "sto": 2}  # the final evaluation is the last cadence's, both modes
    assert summary["stochastic_return_mean"] == -100.0
    assert summary["eval_disagreement"]["earlier_evaluations"] == [10]


def test_noise_around_zero_is_not_a_disagreement():
    """LunarLander hovering: 20 points apart, near zero, with episodes spread ± 30: the spread sets the scale."""
    assert evaluation_disagreement(Evaluation(-6.9, 30.0, 10), Evaluation(0.0, 25.0, 10, False), 20.6) is None
