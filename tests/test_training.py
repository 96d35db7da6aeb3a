"""The training loop's own checks: an evaluation that contradicts the training curve is named."""

from __future__ import annotations

from frugalrl.training import Evaluation, evaluation_disagreement


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
