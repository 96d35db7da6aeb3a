"""V-trace, importance weights, Retrace and AcceRL's Corrector chain (frugalrl.correct)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from frugalrl.correct import (
    CorrectionBatch,
    Corrector,
    CorrectorChain,
    ISCorrector,
    RetraceCorrector,
    VTraceCorrector,
    parse_correctors,
)
from frugalrl.returns import gae, importance_weights, retrace, vtrace

pytestmark = pytest.mark.timeout(60)

SHAPES = [(1, 1), (1, 4), (5, 1), (7, 3), (16, 4), (33, 2)]


def _ref_vtrace(mu_logp, pi_logp, r, v, nv, term, done, gamma, rho_bar, c_bar, lam=1.0, rho_one=False):
    """NumPy float64 loops straight from IMPALA's definition, cut at episode ends.

    ``v_s = V(x_s) + Σ_{t=s}^{s+n−1} γ^{t−s} (Π_{i=s}^{t−1} c_i) δ_t`` with the sum stopping at the
    first step ``t ≥ s`` with ``done_t`` (or the fragment's end).
    """
    mu_logp, pi_logp, r, v, nv = (np.asarray(x, np.float64) for x in (mu_logp, pi_logp, r, v, nv))
    term, done = np.asarray(term, bool), np.asarray(done, bool)
    T, N = r.shape
    ratio = np.exp(pi_logp - mu_logp)
    rho = np.ones_like(ratio) if rho_one else np.minimum(ratio, np.inf if rho_bar is None else rho_bar)
    c = lam * np.minimum(ratio, np.inf if c_bar is None else c_bar)
    vs = np.zeros((T, N))
    adv = np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            total = v[s, n]
            disc, cprod = 1.0, 1.0
            for t in range(s, T):
                delta = rho[t, n] * (r[t, n] + gamma * (0.0 if term[t, n] else nv[t, n]) - v[t, n])
                total += disc * cprod * delta
                if done[t, n]:
                    break
                cprod *= c[t, n]
                disc *= gamma
            vs[s, n] = total
        for t in range(T):
            nxt = vs[t + 1, n] if t + 1 < T and not done[t, n] else nv[t, n]
            adv[t, n] = rho[t, n] * (r[t, n] + gamma * (0.0 if term[t, n] else nxt) - v[t, n])
    return vs, adv


def _ref_nstep(r, nv, term, done, gamma):
    """Discounted rewards to the episode's or fragment's end, bootstrapped from ``next_values`` there."""
    T, N = r.shape
    out = np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            g, disc = 0.0, 1.0
            for t in range(s, T):
                g += disc * r[t, n]
                disc *= gamma
                if done[t, n] or t == T - 1:
                    g += disc * (0.0 if term[t, n] else nv[t, n])
                    break
            out[s, n] = g
    return out


def _data(rng, T, N, *, consistent=False, spread=1.0, p_end=0.2):
    """Random rollout data (float64 numpy). ``consistent``: ``next_values[t] = values[t+1]`` within episodes."""
    r = rng.normal(size=(T, N))
    v = rng.normal(size=(T, N))
    nv = rng.normal(size=(T, N))
    term = rng.random((T, N)) < p_end
    trunc = (rng.random((T, N)) < p_end) & ~term
    done = term | trunc
    if consistent:
        cont = ~done[:-1]
        nv[:-1][cont] = v[1:][cont]
    mu = rng.normal(size=(T, N)) - 1.0
    pi = mu + spread * rng.normal(size=(T, N))
    return dict(mu=mu, pi=pi, r=r, v=v, nv=nv, term=term, done=done)


def _vt(d, gamma, dtype=torch.float64, **kw):
    t = {k: torch.as_tensor(x, dtype=dtype) if x.dtype != bool else torch.as_tensor(x) for k, x in d.items()}
    return vtrace(t["mu"], t["pi"], t["r"], t["v"], t["nv"], t["term"], t["done"], gamma, **kw)


def _batch(d, gamma):
    t = {k: torch.as_tensor(x) for k, x in d.items()}
    return CorrectionBatch(t["mu"], t["pi"], t["r"], t["v"], t["nv"], t["term"], t["done"], gamma)


# ------------------------------------------------------------------------------- V-trace vs reference


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("clips", [(1.0, 1.0), (None, None), (2.0, 0.5), (0.7, 1.3)])
def test_vtrace_matches_numpy_reference(shape, clips):
    rho_bar, c_bar = clips
    for seed in range(3):
        rng = np.random.default_rng(seed)
        d = _data(rng, *shape)
        gamma = float(rng.uniform(0.5, 0.999))
        out = _vt(d, gamma, rho_bar=rho_bar, c_bar=c_bar)
        vs, adv = _ref_vtrace(
            d["mu"], d["pi"], d["r"], d["v"], d["nv"], d["term"], d["done"], gamma, rho_bar, c_bar
        )
        np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(out.pg_advantages.numpy(), adv, rtol=1e-10, atol=1e-10)
        ratio = np.exp(d["pi"] - d["mu"])
        np.testing.assert_allclose(out.rhos.numpy(), np.minimum(ratio, rho_bar or np.inf), rtol=1e-12)
        np.testing.assert_allclose(out.cs.numpy(), np.minimum(ratio, c_bar or np.inf), rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 12),
    N=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    gamma=st.floats(0.0, 1.0),
    rho_bar=st.one_of(st.none(), st.floats(0.1, 3.0)),
    c_bar=st.one_of(st.none(), st.floats(0.1, 3.0)),
    p_end=st.floats(0.0, 1.0),
)
def test_vtrace_matches_reference_property(T, N, seed, gamma, rho_bar, c_bar, p_end):
    d = _data(np.random.default_rng(seed), T, N, p_end=p_end)
    out = _vt(d, gamma, rho_bar=rho_bar, c_bar=c_bar)
    vs, adv = _ref_vtrace(
        d["mu"], d["pi"], d["r"], d["v"], d["nv"], d["term"], d["done"], gamma, rho_bar, c_bar
    )
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(out.pg_advantages.numpy(), adv, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("clips", [(None, None), (1.0, 1.0), (5.0, 0.3)])
def test_on_policy_vtrace_is_nstep_returns(shape, clips):
    """target == behaviour: ratios are 1, so any clip ≥ 1 is moot and vs telescopes to n-step returns."""
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        d = _data(rng, *shape, consistent=True)
        d["pi"] = d["mu"].copy()
        gamma = 0.97
        out = _vt(d, gamma, rho_bar=clips[0], c_bar=clips[1])
        if clips[1] is None or clips[1] >= 1.0:
            expected = _ref_nstep(d["r"], d["nv"], d["term"], d["done"], gamma)
            np.testing.assert_allclose(out.vs.numpy(), expected, rtol=1e-10, atol=1e-10)
            # ... which are GAE(λ = 1)'s returns, and the pg advantage is the one-step-ahead TD on vs.
            t = {k: torch.as_tensor(x) for k, x in d.items()}
            _, gae_returns = gae(t["r"], t["v"], t["nv"], t["term"], t["done"], gamma, 1.0)
            np.testing.assert_allclose(out.vs.numpy(), gae_returns.numpy(), rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(out.pg_advantages.numpy(), expected - d["v"], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(out.rhos, torch.ones_like(out.rhos))


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95])
def test_on_policy_vtrace_with_trace_lambda_is_gae(lam):
    """V-trace's λ (IMPALA paper, remark 2) on policy: vs are GAE(λ)'s returns, and the reference agrees off policy."""
    rng = np.random.default_rng(3)
    d = _data(rng, 17, 3, consistent=True)
    t = {k: torch.as_tensor(x) for k, x in d.items()}
    on = vtrace(t["mu"], t["mu"], t["r"], t["v"], t["nv"], t["term"], t["done"], 0.97, lam=lam)
    _, gae_returns = gae(t["r"], t["v"], t["nv"], t["term"], t["done"], 0.97, lam)
    np.testing.assert_allclose(on.vs.numpy(), gae_returns.numpy(), rtol=1e-9, atol=1e-9)
    off = vtrace(t["mu"], t["pi"], t["r"], t["v"], t["nv"], t["term"], t["done"], 0.97, rho_bar=1.0, c_bar=1.0, lam=lam)
    vs, adv = _ref_vtrace(d["mu"], d["pi"], d["r"], d["v"], d["nv"], d["term"], d["done"], 0.97, 1.0, 1.0, lam=lam)
    np.testing.assert_allclose(off.vs.numpy(), vs, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(off.pg_advantages.numpy(), adv, rtol=1e-9, atol=1e-9)


def test_rho_bar_one_on_large_ratios_gives_uncorrected_returns_and_clipping_matters():
    rng = np.random.default_rng(7)
    d = _data(rng, 20, 3, consistent=True, spread=0.0)
    d["pi"] = d["mu"] + rng.uniform(0.2, 1.0, size=d["mu"].shape)  # every ratio > 1
    gamma = 0.9
    clipped = _vt(d, gamma, rho_bar=1.0, c_bar=1.0)
    expected = _ref_nstep(d["r"], d["nv"], d["term"], d["done"], gamma)
    np.testing.assert_allclose(clipped.vs.numpy(), expected, rtol=1e-10, atol=1e-10)
    assert torch.all(clipped.rhos == 1.0) and torch.all(clipped.cs == 1.0)
    unclipped = _vt(d, gamma, rho_bar=None, c_bar=None)
    assert torch.all(unclipped.rhos > 1.0)
    assert not np.allclose(unclipped.vs.numpy(), expected)
    # Ratios < 1 everywhere: clipping at 1 is a no-op.
    d["pi"] = d["mu"] - rng.uniform(0.2, 1.0, size=d["mu"].shape)
    torch.testing.assert_close(
        _vt(d, gamma, rho_bar=1.0, c_bar=1.0).vs, _vt(d, gamma, rho_bar=None, c_bar=None).vs
    )


def test_episode_cuts():
    """A terminated step targets its reward only; a truncated one bootstraps from next_values."""
    d = _data(np.random.default_rng(3), 6, 2)
    d["term"][:] = False
    d["done"][:] = False
    d["term"][2, 0] = d["done"][2, 0] = True
    d["done"][2, 1] = True  # truncation
    out = _vt(d, 0.9, rho_bar=None, c_bar=None)
    rho = np.exp(d["pi"] - d["mu"])
    np.testing.assert_allclose(out.vs[2, 0].item(), d["v"][2, 0] + rho[2, 0] * (d["r"][2, 0] - d["v"][2, 0]))
    np.testing.assert_allclose(
        out.vs[2, 1].item(), d["v"][2, 1] + rho[2, 1] * (d["r"][2, 1] + 0.9 * d["nv"][2, 1] - d["v"][2, 1])
    )
    # Later steps do not leak into the ended episode: changing rewards after t=2 leaves t ≤ 2 alone.
    d2 = {k: x.copy() for k, x in d.items()}
    d2["r"][3:] += 100.0
    torch.testing.assert_close(_vt(d2, 0.9).vs[:3], _vt(d, 0.9).vs[:3])


def test_vtrace_is_gradient_free_float32_and_checks_shapes():
    d = _data(np.random.default_rng(0), 8, 2)
    t = {
        k: torch.as_tensor(x, dtype=torch.float32) if x.dtype != bool else torch.as_tensor(x)
        for k, x in d.items()
    }
    t["v"].requires_grad_(True)
    t["pi"].requires_grad_(True)
    out = vtrace(t["mu"], t["pi"], t["r"], t["v"], t["nv"], t["term"], t["done"], 0.99)
    assert all(not x.requires_grad for x in out) and out.vs.dtype == torch.float32
    vs, _ = _ref_vtrace(d["mu"], d["pi"], d["r"], d["v"], d["nv"], d["term"], d["done"], 0.99, 1.0, 1.0)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="shape"):
        vtrace(t["mu"][:-1], t["pi"], t["r"], t["v"], t["nv"], t["term"], t["done"], 0.99)


# ------------------------------------------------------------------------- importance weights, Retrace


def test_importance_weights_clipping():
    target = torch.tensor([[0.0, 1.0], [-1.0, 2.0]], requires_grad=True)
    behaviour = torch.zeros(2, 2)
    w = importance_weights(target, behaviour)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [float(np.exp(-1.0)), 1.0]]))
    assert not w.requires_grad
    torch.testing.assert_close(importance_weights(target, behaviour, clip=None), target.detach().exp())
    torch.testing.assert_close(
        importance_weights(target, behaviour, clip=2.0), target.detach().exp().clamp(max=2.0)
    )
    # Extreme log-ratios saturate instead of producing nan.
    assert importance_weights(torch.tensor([1e4]), torch.tensor([0.0])).item() == 1.0


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_retrace_matches_reference(lam):
    for seed, shape in enumerate(SHAPES):
        d = _data(np.random.default_rng(seed), *shape)
        t = {k: torch.as_tensor(x) for k, x in d.items()}
        out = retrace(t["mu"], t["pi"], t["r"], t["v"], t["nv"], t["term"], t["done"], 0.95, lam=lam)
        vs, adv = _ref_vtrace(
            d["mu"],
            d["pi"],
            d["r"],
            d["v"],
            d["nv"],
            d["term"],
            d["done"],
            0.95,
            None,
            1.0,
            lam=lam,
            rho_one=True,
        )
        np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(out.pg_advantages.numpy(), adv, rtol=1e-10, atol=1e-10)
        assert torch.all(out.rhos == 1.0)
    # λ = 0: one-step TD targets.
    d = _data(np.random.default_rng(9), 5, 2)
    t = {k: torch.as_tensor(x) for k, x in d.items()}
    out = retrace(t["mu"], t["pi"], t["r"], t["v"], t["nv"], t["term"], t["done"], 0.9, lam=0.0)
    np.testing.assert_allclose(out.vs.numpy(), d["r"] + 0.9 * d["nv"] * ~d["term"])


# --------------------------------------------------------------------------------------------- chain


def test_empty_chain_gives_uncorrected_on_policy_targets():
    rng = np.random.default_rng(1)
    d = _data(rng, 12, 3, consistent=True)
    out = CorrectorChain().correct(_batch(d, 0.9))
    expected = _ref_nstep(d["r"], d["nv"], d["term"], d["done"], 0.9)
    np.testing.assert_allclose(out.value_targets.numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected - d["v"], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.pg_weights, torch.ones(12, 3, dtype=torch.float64))
    assert CorrectorChain().describe() == "none" and len(CorrectorChain()) == 0


def test_vtrace_and_is_chain():
    d = _data(np.random.default_rng(2), 10, 3, spread=0.5)
    batch = _batch(d, 0.95)
    chain = CorrectorChain().add(VTraceCorrector(1.0, 1.0)).add(ISCorrector(1.0))
    assert [type(c) for c in chain] == [VTraceCorrector, ISCorrector]
    assert chain.describe() == "vtrace(rho_bar=1.0, c_bar=1.0) -> is(clip=1.0)"
    out = chain.correct(batch)
    vt = _vt(d, 0.95, rho_bar=1.0, c_bar=1.0)
    torch.testing.assert_close(out.value_targets, vt.vs)
    torch.testing.assert_close(out.pg_advantages, vt.pg_advantages)
    torch.testing.assert_close(
        out.pg_weights, importance_weights(batch.target_logp, batch.behaviour_logp, 1.0)
    )
    # The input batch is left untouched.
    assert batch.value_targets is None and torch.all(batch.pg_weights == 1.0)
    # IS alone: uncorrected targets, weighted gradient; two IS correctors multiply.
    out_is = CorrectorChain().add(ISCorrector(None)).add(ISCorrector(None)).correct(batch)
    torch.testing.assert_close(out_is.value_targets, CorrectorChain().correct(batch).value_targets)
    torch.testing.assert_close(out_is.pg_weights, torch.exp(2 * (batch.target_logp - batch.behaviour_logp)))
    # Retrace fills the targets.
    out_rt = CorrectorChain().add(RetraceCorrector(0.9)).correct(batch)
    t = {k: torch.as_tensor(x) for k, x in d.items()}
    expected = retrace(t["mu"], t["pi"], t["r"], t["v"], t["nv"], t["term"], t["done"], 0.95, 0.9)
    torch.testing.assert_close(out_rt.value_targets, expected.vs)


def test_chain_applies_in_order_and_later_overrides():
    calls: list[str] = []

    class Tag(Corrector):
        def __init__(self, name: str) -> None:
            self.name = name

        def correct(self, batch: CorrectionBatch) -> CorrectionBatch:
            calls.append(self.name)
            return batch.replace(pg_weights=batch.pg_weights * 2 + len(calls))

    d = _data(np.random.default_rng(4), 4, 2)
    out = CorrectorChain().add(Tag("a")).add(Tag("b")).add(Tag("c")).correct(_batch(d, 0.9))
    assert calls == ["a", "b", "c"]
    assert torch.all(out.pg_weights == ((1 * 2 + 1) * 2 + 2) * 2 + 3)
    # The last V-trace corrector wins.
    b = _batch(d, 0.9)
    out = CorrectorChain().add(VTraceCorrector(None, None)).add(VTraceCorrector(0.5, 0.5)).correct(b)
    torch.testing.assert_close(out.value_targets, _vt(d, 0.9, rho_bar=0.5, c_bar=0.5).vs)
    with pytest.raises(TypeError):
        CorrectorChain().add("vtrace")  # type: ignore[arg-type]


def test_parse_correctors():
    chain = parse_correctors("vtrace,is")
    assert [type(c) for c in chain] == [VTraceCorrector, ISCorrector]
    assert chain.describe() == "vtrace(rho_bar=1.0, c_bar=1.0) -> is(clip=1.0)"
    assert (
        parse_correctors("vtrace:2:0.5, is:1.5").describe()
        == "vtrace(rho_bar=2.0, c_bar=0.5) -> is(clip=1.5)"
    )
    assert parse_correctors("vtrace:inf:inf").describe() == "vtrace(rho_bar=None, c_bar=None)"
    assert parse_correctors("retrace:0.9").describe() == "retrace(lam=0.9)"
    assert parse_correctors("vtrace:1:1:0.95").describe() == "vtrace(rho_bar=1.0, c_bar=1.0, lam=0.95)"
    assert len(parse_correctors("none")) == 0 and len(parse_correctors("")) == 0
    assert len(parse_correctors("IS,none")) == 1


@pytest.mark.parametrize(
    "bad", ["vtraec", "vtrace:1", "is:0", "is:x", "retrace:2", "is:1:2", "vtrace,,is", "none:1", "vtrace:1:1:2"]
)
def test_parse_correctors_errors(bad):
    with pytest.raises(ValueError) as err:
        parse_correctors(bad)
    msg = str(err.value)
    assert "valid words" in msg and "vtrace:RHO:C" in msg and "retrace:LAM" in msg
    bad_word = next(w.strip() for w in bad.split(",") if w.strip() not in ("vtrace", "is"))
    assert repr(bad_word) in msg
