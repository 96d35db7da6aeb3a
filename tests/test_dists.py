"""Action distributions: closed-form KL, log-probabilities and entropies against references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributions import Bernoulli, Categorical, Independent, Normal, kl_divergence

from frugalrl import dists, npactor

pytestmark = pytest.mark.timeout(60)


def _categorical_params(g: torch.Generator, rows: int, n: int, spread: float) -> torch.Tensor:
    return torch.randn(rows, n, generator=g, dtype=torch.float64) * spread


def _gaussian_params(g: torch.Generator, rows: int, d: int, spread: float) -> torch.Tensor:
    mean = torch.randn(rows, d, generator=g, dtype=torch.float64) * spread
    log_std = torch.randn(rows, d, generator=g, dtype=torch.float64) * 0.5 * spread
    return torch.cat([mean, log_std], -1)


def _nvec(size: int) -> list[int]:
    """The sub-action sizes of a multi-categorical test distribution: rows of different widths, so some are padded."""
    return [2, size, 3]


def _multi_params(g: torch.Generator, rows: int, size: int, spread: float) -> torch.Tensor:
    nvec = _nvec(size)
    params = torch.full((rows, len(nvec), max(nvec)), dists.PAD_LOGIT, dtype=torch.float64)
    for i, n in enumerate(nvec):
        params[:, i, :n] = torch.randn(rows, n, generator=g, dtype=torch.float64) * spread
    return params


def _params(kind: str, g: torch.Generator, rows: int, size: int, spread: float) -> torch.Tensor:
    if kind in ("categorical", "bernoulli"):
        return _categorical_params(g, rows, size, spread)
    if kind == "multi_categorical":
        return _multi_params(g, rows, size, spread)
    return _gaussian_params(g, rows, size, spread)


def _reference(kind: str, params: torch.Tensor):
    if kind == "categorical":
        return Categorical(logits=params)
    if kind == "multi_categorical":
        return Independent(Categorical(logits=params), 1)
    if kind == "bernoulli":
        return Independent(Bernoulli(logits=params), 1)
    d = params.shape[-1] // 2
    return Independent(Normal(params[..., :d], params[..., d:].exp()), 1)


EVERY_KIND = [("categorical", 5), ("gaussian", 4), ("multi_categorical", 5), ("bernoulli", 4)]


@pytest.mark.parametrize("kind, size", [("categorical", 2), ("categorical", 6), ("gaussian", 1), ("gaussian", 3),
                                        ("multi_categorical", 2), ("multi_categorical", 6), ("bernoulli", 1),
                                        ("bernoulli", 3)])
@pytest.mark.parametrize("set_index", range(3))
def test_closed_form_kl_matches_monte_carlo(kind, size, set_index):
    """The MC estimate lies within 5 standard errors of the closed form (error from the sample spread)."""
    g = torch.Generator().manual_seed(100 + set_index)
    p = _params(kind, g, 6, size, spread=0.3 + 0.6 * set_index)
    q = _params(kind, g, 6, size, spread=0.3 + 0.6 * set_index)
    n = 40_000
    closed = dists.kl(kind, p, q)
    mc = dists.kl_monte_carlo(kind, p, q, n=n, generator=torch.Generator().manual_seed(set_index))
    assert mc.shape == closed.shape == (6,)
    # Standard error of the mean of log p(a) - log q(a), a ~ p, estimated with torch.distributions.
    ref_p, ref_q = _reference(kind, p), _reference(kind, q)
    torch.manual_seed(set_index)
    a = ref_p.sample((n,))
    llr = ref_p.log_prob(a) - ref_q.log_prob(a)
    stderr = llr.std(0) / n**0.5
    assert torch.all((mc - closed).abs() <= 5 * stderr + 1e-9), (mc, closed, stderr)


@pytest.mark.parametrize("kind, size", EVERY_KIND)
def test_kl_of_a_distribution_with_itself_is_zero(kind, size):
    g = torch.Generator().manual_seed(1)
    for spread in (0.1, 1.0, 5.0):
        p = _params(kind, g, 32, size, spread)
        torch.testing.assert_close(dists.kl(kind, p, p), torch.zeros(32, dtype=p.dtype), atol=1e-12, rtol=0)
        p32 = p.float()
        assert dists.kl(kind, p32, p32).abs().max() < 1e-6


@pytest.mark.parametrize("kind, size", EVERY_KIND)
def test_kl_is_non_negative(kind, size):
    g = torch.Generator().manual_seed(2)
    for spread in (0.01, 0.5, 3.0, 20.0):
        p = _params(kind, g, 256, size, spread)
        q = _params(kind, g, 256, size, spread)
        k = dists.kl(kind, p, q)
        assert torch.isfinite(k).all()
        assert (k >= -1e-10).all(), k.min()


def test_categorical_kl_matches_numpy():
    rng = np.random.default_rng(3)
    for n in (2, 3, 10):
        lp = rng.normal(size=(20, n)) * 2
        lq = rng.normal(size=(20, n)) * 2
        p = np.exp(lp - lp.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        q = np.exp(lq - lq.max(-1, keepdims=True))
        q /= q.sum(-1, keepdims=True)
        expected = (p * (np.log(p) - np.log(q))).sum(-1)
        got = dists.kl("categorical", torch.from_numpy(lp), torch.from_numpy(lq)).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_categorical_kl_is_shift_invariant():
    g = torch.Generator().manual_seed(4)
    p = _categorical_params(g, 8, 4, 1.0)
    q = _categorical_params(g, 8, 4, 1.0)
    torch.testing.assert_close(dists.kl("categorical", p + 3.0, q - 7.0), dists.kl("categorical", p, q))


def test_gaussian_kl_matches_torch():
    g = torch.Generator().manual_seed(5)
    for d in (1, 2, 6):
        p = _gaussian_params(g, 16, d, 1.0)
        q = _gaussian_params(g, 16, d, 1.0)
        expected = kl_divergence(_reference("gaussian", p), _reference("gaussian", q))
        torch.testing.assert_close(dists.kl("gaussian", p, q), expected)


def test_batched_shapes():
    g = torch.Generator().manual_seed(6)
    p = torch.randn(3, 5, 4, generator=g)
    q = torch.randn(3, 5, 4, generator=g)
    assert dists.kl("categorical", p, q).shape == (3, 5)
    assert dists.kl("gaussian", p, q).shape == (3, 5)
    assert dists.entropy("gaussian", p).shape == (3, 5)
    a = dists.sample("categorical", p, g)
    assert a.shape == (3, 5) and a.dtype == torch.int64
    assert dists.log_prob("categorical", p, a).shape == (3, 5)
    a = dists.sample("gaussian", p, g)
    assert a.shape == (3, 5, 2) and a.dtype == torch.float32
    assert dists.log_prob("gaussian", p, a).shape == (3, 5)


@pytest.mark.parametrize("n", [2, 7])
def test_categorical_log_prob_entropy_mode_vs_torch(n):
    g = torch.Generator().manual_seed(7)
    params = _categorical_params(g, 64, n, 2.0)
    ref = Categorical(logits=params)
    actions = torch.randint(0, n, (64,), generator=g)
    torch.testing.assert_close(dists.log_prob("categorical", params, actions), ref.log_prob(actions))
    torch.testing.assert_close(dists.entropy("categorical", params), ref.entropy())
    torch.testing.assert_close(dists.mode("categorical", params), params.argmax(-1))
    # Actions may arrive as floats or int32 from a rollout buffer.
    torch.testing.assert_close(dists.log_prob("categorical", params, actions.int()), ref.log_prob(actions))


@pytest.mark.parametrize("d", [1, 3])
def test_gaussian_log_prob_entropy_mode_vs_torch(d):
    g = torch.Generator().manual_seed(8)
    params = _gaussian_params(g, 64, d, 1.0)
    ref = _reference("gaussian", params)
    actions = ref.sample()
    torch.testing.assert_close(dists.log_prob("gaussian", params, actions), ref.log_prob(actions))
    torch.testing.assert_close(dists.entropy("gaussian", params), ref.entropy())
    torch.testing.assert_close(dists.mode("gaussian", params), params[:, :d])


@pytest.mark.parametrize("kind, size", EVERY_KIND[2:])
def test_multi_action_log_prob_entropy_mode_vs_torch(kind, size):
    """MultiDiscrete's sub-actions and MultiBinary's bits: independent parts, scored as their product; the padding
    of a shorter row is never the mode."""
    g = torch.Generator().manual_seed(12)
    params = _params(kind, g, 64, size, 2.0)
    ref = _reference(kind, params)
    actions = ref.sample()
    torch.testing.assert_close(dists.log_prob(kind, params, actions), ref.log_prob(actions))
    torch.testing.assert_close(dists.entropy(kind, params), ref.entropy())
    torch.testing.assert_close(dists.mode(kind, params).to(actions.dtype),
                               ref.base_dist.probs.argmax(-1).to(actions.dtype) if kind == "multi_categorical"
                               else (ref.base_dist.probs > 0.5).to(actions.dtype))
    # the workers' numpy arithmetic (float32) scores the same
    np.testing.assert_allclose(npactor.log_prob(kind, params.float().numpy(), actions.numpy()),
                               ref.log_prob(actions).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sampler", ["torch", "numpy"])
def test_multi_action_sampling_frequencies(sampler):
    """Each sub-action (each bit) is drawn with its own probabilities, the padding never, in torch and numpy."""
    n = 100_000
    rows = torch.tensor([[[0.0, 1.0, -1.0], [2.0, 0.0, dists.PAD_LOGIT]]])
    bits = torch.tensor([[1.5, -0.5, 0.0]])
    if sampler == "torch":
        a = dists.sample("multi_categorical", rows.expand(n, 2, 3), torch.Generator().manual_seed(13))
        b = dists.sample("bernoulli", bits.expand(n, 3), torch.Generator().manual_seed(14))
    else:
        rng = np.random.default_rng(13)
        a = torch.from_numpy(npactor.sample("multi_categorical", rows.expand(n, 2, 3).numpy(), rng))
        b = torch.from_numpy(npactor.sample("bernoulli", bits.expand(n, 3).numpy(), rng))
    assert a.shape == (n, 2) and a.dtype == torch.int64 and b.shape == (n, 3) and b.dtype == torch.int8
    assert int(a[:, 1].max()) <= 1  # the padded third choice of the second row
    for i in range(2):
        probs = torch.softmax(rows[0, i].double(), -1)
        freq = torch.bincount(a[:, i], minlength=3).double() / n
        assert torch.all((freq - probs).abs() < 5 * (probs * (1 - probs) / n).sqrt() + 1e-9)
    p = torch.sigmoid(bits[0].double())
    assert torch.all((b.double().mean(0) - p).abs() < 5 * (p * (1 - p) / n).sqrt())


def test_categorical_sampling_frequencies():
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]])
    n = 200_000
    a = dists.sample("categorical", logits.expand(n, 4), torch.Generator().manual_seed(9))
    freq = torch.bincount(a, minlength=4).double() / n
    probs = torch.softmax(logits[0].double(), -1)
    assert torch.all((freq - probs).abs() < 5 * (probs * (1 - probs) / n).sqrt())


def test_gaussian_sampling_moments():
    params = torch.tensor([[1.5, -2.0, np.log(0.5), np.log(3.0)]], dtype=torch.float32)
    n = 200_000
    a = dists.sample("gaussian", params.expand(n, 4), torch.Generator().manual_seed(10))
    assert torch.allclose(a.mean(0), torch.tensor([1.5, -2.0]), atol=0.03)
    assert torch.allclose(a.std(0), torch.tensor([0.5, 3.0]), rtol=0.02)


def test_sampling_is_reproducible_with_a_generator():
    p = torch.randn(10, 3)
    a1 = dists.sample("categorical", p, torch.Generator().manual_seed(11))
    a2 = dists.sample("categorical", p, torch.Generator().manual_seed(11))
    torch.testing.assert_close(a1, a2)


def test_bad_arguments():
    p = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="different shapes"):
        dists.kl("categorical", p, torch.zeros(3, 5))
    with pytest.raises(ValueError, match="unknown distribution kind 'beta'"):
        dists.kl("beta", p, p)
    with pytest.raises(ValueError, match="unknown distribution kind 'beta'"):
        dists.sample("beta", p)


def test_entropy_bonus_stops_at_half_the_action_box():
    """Below the cap the bonus is the entropy; above it the bonus no longer grows with log σ (no gradient), and
    unbounded dimensions are not capped. Uncapped, HSA2C's log σ ran to 5-10 on Pendulum-v1
    (see :func:`dists.entropy_bonus`)."""
    from frugalrl.nets import box_log_half_width

    cap = box_log_half_width({"low": [-2.0, -np.inf], "high": [2.0, np.inf]})
    assert torch.allclose(cap[:1], torch.tensor([np.log(2.0)], dtype=torch.float32)) and torch.isinf(cap[1])
    log_std = torch.tensor([[0.1, 5.0], [3.0, 7.0]], requires_grad=True)
    params = torch.cat([torch.zeros(2, 2), log_std], -1)
    bonus = dists.entropy_bonus("gaussian", params, cap)
    assert torch.allclose(bonus[0], dists.entropy("gaussian", params)[0])
    bonus.sum().backward()
    assert log_std.grad is not None
    assert log_std.grad.tolist() == [[1.0, 1.0], [0.0, 1.0]]  # row 2's first σ is past half the box
    logits = torch.randn(3, 4)
    assert torch.equal(dists.entropy_bonus("categorical", logits, cap), dists.entropy("categorical", logits))


def test_ppo_logs_the_policy_entropy_not_the_capped_bonus():
    """``losses/entropy`` reports the policy's entropy even when the bonus it was rewarded is capped: a Gaussian
    with log σ = 3 on a [-1, 1] box logs 3 + ½ log(2πe) per dimension, not the cap's ½ log(2πe)."""
    from frugalrl.losses import SurrogateBatch, SurrogateConfig, surrogate_epochs
    from frugalrl.nets import MLPActorCritic

    torch.manual_seed(0)
    agent = MLPActorCritic(3, {"type": "box", "shape": [2], "low": [-1, -1], "high": [1, 1]}, log_std_init=3.0)
    n = 16
    batch = SurrogateBatch(obs=torch.randn(n, 3), actions=torch.randn(n, 2), old_logp=torch.zeros(n),
                           advantages=torch.randn(n), returns=torch.randn(n), values=torch.zeros(n),
                           weights=torch.ones(n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-6)
    stats = surrogate_epochs(agent, optimizer, batch, SurrogateConfig(num_minibatches=1, update_epochs=1),
                             ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, generator=torch.Generator())
    assert stats["losses/entropy"] == pytest.approx(2 * (3.0 + 0.5 * np.log(2 * np.pi * np.e)), abs=1e-3)
