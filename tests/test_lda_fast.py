"""DPSVI's fast paths: the E-step backends (frugalrl.dpsgd.lda_estep), column-sparse pushes
(frugalrl.dpsgd.sparse through the worker, the wire and the server) and epoch sampling."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from frugalrl.dpsgd.config import DPSGDConfig
from frugalrl.dpsgd.corpora import Corpus
from frugalrl.dpsgd.lda import LDAConfig, LDAProblem, fit_lda
from frugalrl.dpsgd.lda_estep import HAVE_NUMBA, dirichlet_expectation, e_step, resolve_backend
from frugalrl.dpsgd.server import ParameterServer
from frugalrl.dpsgd.sparse import ColumnUpdate, supports_columns
from frugalrl.dpsgd.worker import hogwild_steps
from frugalrl.wire.message import Message, decode_message, encode_message

SMALL = {"n_docs": 400, "vocab": 150, "doc_len": 60, "alpha": 0.1, "eta": 0.05}
BACKENDS = ["numpy", *(["numba"] if HAVE_NUMBA else [])]


def lockstep_e_step(corpus, exp_elog_beta, alpha, max_iter, tol, gamma):
    """The E-step as frugalrl had it before the backends: every document iterates until all have
    converged (vectorised over the batch), from the start ``gamma``. The reference the backends match."""
    k, v = exp_elog_beta.shape
    lengths = np.diff(corpus.indptr)
    doc_of = corpus.entry_docs()
    nonempty = lengths > 0
    starts = corpus.indptr[:-1][nonempty]
    bt = exp_elog_beta[:, corpus.word_ids].T
    cts = corpus.counts
    gamma = gamma.copy()
    theta = np.exp(dirichlet_expectation(gamma))

    def weighted(th):
        rows = th[doc_of]
        return rows, cts / (np.einsum("jk,jk->j", rows, bt) + 1e-100)

    for _ in range(max_iter):
        _, ratio = weighted(theta)
        total = np.zeros((corpus.n_docs, k))
        total[nonempty] = np.add.reduceat(ratio[:, None] * bt, starts, axis=0)
        new = alpha + theta * total
        change = np.abs(new - gamma).mean(axis=1)
        gamma = new
        theta = np.exp(dirichlet_expectation(gamma))
        if change.max(initial=0.0) < tol:
            break
    rows, ratio = weighted(theta)
    out = np.zeros((v, k))
    np.add.at(out, corpus.word_ids, rows * bt * ratio[:, None])
    return gamma, out.T


def _batch(seed=0, n_docs=48):
    """A batch of a small synthetic problem and an informative ``exp(E[log β])`` (after a few SVI steps)."""
    p = LDAProblem(corpus="synthetic", n_topics=6, seed=seed, batch_size=n_docs, synthetic=SMALL)
    rng = np.random.default_rng(seed)
    lam = p.topics(p.init_params())
    for _ in range(3):
        lam = 0.5 * lam + 0.5 * p.lambda_hat(lam.ravel(), p.sample_batch(rng), rng)
    docs = p.train.subset(p.sample_batch(rng))
    # an empty document too: it must keep its start and add nothing
    docs = Corpus(np.append(docs.indptr, docs.indptr[-1]), docs.word_ids, docs.counts, docs.n_words)
    return p, docs, np.exp(dirichlet_expectation(lam))


# ------------------------------------------------------------------------------------ E-step
@pytest.mark.parametrize("backend", BACKENDS)
def test_e_step_backends_match_the_lockstep_e_step(backend):
    p, docs, eb = _batch()
    start = np.random.default_rng(3).gamma(100.0, 0.01, (docs.n_docs, 6))
    # converged fits: the same fixed point
    g_ref, s_ref = lockstep_e_step(docs, eb, p.alpha, 5000, 1e-10, start)
    g, s = e_step(docs, eb, p.alpha, 5000, 1e-10, rng=np.random.default_rng(3), backend=backend)
    np.testing.assert_allclose(g, g_ref, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(s, s_ref, rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(g[-1], p.alpha)  # the empty document: γ = α
    # at the default tolerance a document stops on its own instead of with the slowest one: close
    g_ref, s_ref = lockstep_e_step(docs, eb, p.alpha, 100, 1e-3, start)
    g, s = e_step(docs, eb, p.alpha, 100, 1e-3, rng=np.random.default_rng(3), backend=backend)
    assert np.abs(s - s_ref).max() <= 2e-2 * np.abs(s_ref).max()
    assert np.abs(g - g_ref).max() <= 2e-2 * np.abs(g_ref).max()
    np.testing.assert_allclose(s.sum(axis=0), docs.to_dense().sum(axis=0), rtol=1e-9)  # Σ_k S_kw = n_w


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
def test_numba_and_numpy_e_steps_agree_to_rounding():
    p, docs, eb = _batch(seed=1)
    for sstats in (True, False):
        a = e_step(docs, eb, p.alpha, 100, 1e-3, sstats, np.random.default_rng(0), backend="numpy")
        b = e_step(docs, eb, p.alpha, 100, 1e-3, sstats, np.random.default_rng(0), backend="numba")
        np.testing.assert_allclose(b[0], a[0], rtol=1e-10)
        if sstats:
            np.testing.assert_allclose(b[1], a[1], rtol=1e-10, atol=1e-12)
        else:
            assert a[1] is None and b[1] is None


def test_e_step_backend_is_checked():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cython")
    with pytest.raises(ValueError, match="LDAConfig.e_step_backend"):
        LDAConfig(e_step_backend="cython")
    assert resolve_backend("auto") == ("numba" if HAVE_NUMBA else "numpy")


# ------------------------------------------------------------------------------------ column pushes
def _problem(vocab=150, batch=16, **kw):
    return LDAProblem(
        corpus="synthetic", n_topics=5, seed=2, batch_size=batch, synthetic={**SMALL, "vocab": vocab}, **kw
    )


def test_column_step_is_the_dense_svi_step():
    p = _problem()
    assert supports_columns(p)
    v = p.init_params()
    eta = 0.3
    u_dense, u_cols = v.copy(), v.copy()
    hogwild_steps(u_dense, p, eta, 3, np.random.default_rng(5), "lda")
    p2 = _problem()  # a fresh problem: the same epoch order from the same rng
    rng = np.random.default_rng(5)
    cols = [p2.column_step(u_cols, eta, rng) for _ in range(3)]
    np.testing.assert_allclose(u_cols, u_dense, rtol=2e-5, atol=1e-5)
    update = ColumnUpdate.from_step(u_cols, v, p.column_shape, (1 - eta) ** 3, p.decay_target, np.concatenate(cols))
    np.testing.assert_allclose(update.dense(v), u_dense - v, rtol=1e-4, atol=2e-5)
    untouched = np.setdiff1d(np.arange(p.n_words), update.columns)
    assert untouched.size  # a 16-document batch leaves words out


def _server(v, workers=1):
    return ParameterServer(v, rho=0.7, master_batch=1, workers=workers)


def test_sparse_apply_equals_dense_apply_through_the_wire():
    p = _problem()
    v = p.init_params()
    u = v.copy()
    cols = p.column_step(u, 0.4, np.random.default_rng(0))
    update = ColumnUpdate.from_step(u, v, p.column_shape, 0.6, p.decay_target, cols)
    dense_msg = Message("push", {"version": 0, "steps": 1}, {"grad/w": u - v}, {"grad/w": "fp32"})
    sparse_msg = update.message(0, 1, "fp32")
    results = []
    for msg in (dense_msg, sparse_msg):
        server = _server(v)
        assert server.handle(0, Message("pull")).op == "params"
        got, sizes = decode_message(encode_message(msg)[0])  # never pickled: the wire envelope
        assert set(sizes) >= {"gradients"}
        server.handle(0, got)
        results.append(server.snapshot()[1].copy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-5)
    on = update.columns
    np.testing.assert_allclose(results[1].reshape(p.shape)[:, on], results[0].reshape(p.shape)[:, on], rtol=1e-6)


def test_stale_column_update_is_applied_against_the_pulled_or_the_current_v():
    p = _problem()
    v0 = p.init_params()
    server = _server(v0, workers=2)
    server.handle(0, Message("pull"))
    server.handle(1, Message("pull"))
    u1 = v0.copy()
    c1 = p.column_step(u1, 0.5, np.random.default_rng(1))
    server.handle(1, ColumnUpdate.from_step(u1, v0, p.shape, 0.5, p.decay_target, c1).message(0, 1, "fp32"))
    v1 = server.snapshot()[1].copy()
    u0 = v0.copy()
    c0 = p.column_step(u0, 0.5, np.random.default_rng(2))
    for base in ("pulled", "current"):
        update = ColumnUpdate.from_step(u0, v0, p.shape, 0.5, p.decay_target, c0, base)
        w = ColumnUpdate.from_message(decode_message(encode_message(update.message(0, 1, "fp32"))[0])[0]).dense(
            v0 if base == "pulled" else v1
        )
        if base == "pulled":  # exactly DPSGD's stale update u - v_pulled
            np.testing.assert_allclose(w, u0 - v0, rtol=1e-4, atol=2e-5)
        else:  # the decay of the current v: rho = 1 gives 0.5 v1 + 0.5 prior + innovation
            expected = 0.5 * v1 + 0.5 * p.decay_target - v1
            expected = expected.reshape(p.shape)
            expected[:, update.columns] += update.values
            np.testing.assert_allclose(w, expected.ravel(), rtol=1e-5, atol=1e-5)
    # the server refuses a column push for a version the worker did not pull last
    bad = ColumnUpdate.from_step(u0, v0, p.shape, 0.5, p.decay_target, c0).message(1, 1, "fp32")
    with pytest.raises(ValueError, match="last pull"):
        server.handle(0, bad)


def test_column_update_is_validated():
    with pytest.raises(ValueError, match="base"):
        ColumnUpdate(0.5, 0.1, np.zeros(1, np.int32), np.zeros((2, 1), np.float32), (2, 3), "newest")
    msg = ColumnUpdate(0.5, 0.1, np.array([4], np.int32), np.zeros((2, 1), np.float32), (2, 3)).message(0, 1, "fp32")
    with pytest.raises(ValueError, match="outside"):
        ColumnUpdate.from_message(msg)
    msg.meta.pop("decay")
    with pytest.raises(ValueError, match="malformed"):
        ColumnUpdate.from_message(msg)


def test_column_push_bytes_on_a_large_vocabulary():
    """Pushes shrink with the share of the vocabulary a batch leaves out (here V = 5000, 16 documents)."""
    p = _problem(vocab=5000)
    v = p.init_params()
    u = v.copy()
    cols = p.column_step(u, 0.5, np.random.default_rng(0))
    sparse = encode_message(ColumnUpdate.from_step(u, v, p.shape, 0.5, p.decay_target, cols).message(0, 1, "fp32"))
    dense = encode_message(Message("push", {"version": 0, "steps": 1}, {"grad/w": u - v}, {"grad/w": "fp32"}))
    assert sparse[1]["gradients"] * 5 <= dense[1]["gradients"]


def test_columns_fall_back_to_dense_when_the_batch_covers_the_vocabulary():
    small = ColumnUpdate(0.5, 0.1, np.arange(3, dtype=np.int32), np.zeros((2, 3), np.float32), (2, 10))
    full = ColumnUpdate(0.5, 0.1, np.arange(7, dtype=np.int32), np.zeros((2, 7), np.float32), (2, 10))
    assert small.smaller_than_dense() and not full.smaller_than_dense()
    assert dataclasses.replace(full, base="current").smaller_than_dense()  # no dense equivalent
    base = LDAConfig(
        n_topics=5, synthetic_docs=300, synthetic_vocab=20, synthetic_doc_len=30, batch_size=200,
        global_updates=4, log_every=2, heldout_max_docs=30,
    )
    out = {fmt: fit_lda(dataclasses.replace(base, update_format=fmt)) for fmt in ("dense", "auto")}
    assert out["auto"]["bytes"]["gradients"] == out["dense"]["bytes"]["gradients"]
    np.testing.assert_allclose(out["auto"]["lambda"], out["dense"]["lambda"], rtol=1e-4, atol=1e-4)


def test_column_options_are_checked():
    with pytest.raises(ValueError, match="LDAConfig.processes must be 1 with update_format='columns'"):
        LDAConfig(processes=2, update_format="columns")
    with pytest.raises(ValueError, match="update_format must be one of"):
        LDAConfig(update_format="sparse")
    with pytest.raises(ValueError, match="column_base must be one of"):
        LDAConfig(column_base="newest")
    with pytest.raises(ValueError, match="LDAConfig.sampling"):
        LDAConfig(sampling="stratified")
    assert LDAConfig(processes=2).update_format == "auto"  # dense pushes for Hogwild, columns otherwise
    # column_base "auto": the server decays its current λ when several workers push stale steps
    assert LDAConfig().resolved_column_base() == "pulled"
    assert dataclasses.replace(LDAConfig(), workers=2).resolved_column_base() == "current"
    assert LDAConfig(workers=2).dpsgd_config().worker_config(0, 1.0)["column_base"] == "current"
    assert LDAConfig(workers=2, column_base="pulled").resolved_column_base() == "pulled"
    with pytest.raises(ValueError, match="LDAConfig.init must be one of"):
        LDAConfig(init="kmeans")


def test_seeded_start_nudges_each_topic_towards_a_distinct_document():
    """``init="seeded"``: Hoffman's Gamma(100, 1/100) start plus, on topic k, ``init_seed_weight × V``
    pseudo-counts spread as the words of its seed document; the seed documents are distinct and reproducible;
    ``init="random"`` is the plain Gamma start, the same draws."""
    seeded, plain = _problem(), _problem(init="random")
    lam, lam0 = seeded.init_params(), plain.init_params()
    np.testing.assert_array_equal(lam0, _problem(init="random").init_params())
    np.testing.assert_array_equal(lam, _problem().init_params())
    rng = np.random.default_rng([seeded.seed, 2])
    rng.gamma(100.0, 0.01, size=lam.size)  # the random start's draws come first
    docs = seeded.seed_documents(rng)
    assert len(set(docs.tolist())) == seeded.n_topics
    extra = (lam.astype(np.float64) - lam0).reshape(seeded.shape)
    for k, d in enumerate(docs):
        ids, cts = seeded.train.doc(int(d))
        expected = np.zeros(seeded.n_words)
        expected[ids] = 0.02 * seeded.n_words * cts / cts.sum()
        np.testing.assert_allclose(extra[k], expected, atol=1e-4)


@pytest.mark.slow
def test_fit_lda_columns_matches_dense_with_fewer_bytes():
    """Column pushes rebuild the dense update (fp32: up to rounding); LDA's default bf16 values halve them
    again and leave the fit where fp32 puts it."""
    base = LDAConfig(
        n_topics=5, synthetic_docs=300, synthetic_vocab=3000, synthetic_doc_len=30, batch_size=16,
        global_updates=12, log_every=4, heldout_max_docs=30, update_codec="fp32",
    )
    out = {fmt: fit_lda(dataclasses.replace(base, update_format=fmt)) for fmt in ("dense", "columns")}
    np.testing.assert_allclose(out["columns"]["lambda"], out["dense"]["lambda"], rtol=1e-3, atol=1e-3)
    assert out["columns"]["final_perplexity"] == pytest.approx(out["dense"]["final_perplexity"], rel=1e-3)
    assert out["columns"]["bytes"]["gradients"] * 5 <= out["dense"]["bytes"]["gradients"]
    assert LDAConfig().update_codec == "bf16+zstd"  # bf16 values, compressed
    bf16 = fit_lda(dataclasses.replace(base, update_format="columns", update_codec="bf16"))
    assert bf16["bytes"]["gradients"] < 0.6 * out["columns"]["bytes"]["gradients"]
    assert bf16["final_perplexity"] == pytest.approx(out["columns"]["final_perplexity"], rel=1e-2)
    packed = fit_lda(dataclasses.replace(base, update_format="columns", update_codec="bf16+zstd"))
    assert packed["bytes"]["gradients"] < bf16["bytes"]["gradients"]
    np.testing.assert_array_equal(packed["lambda"], bf16["lambda"])  # one worker: the same run, exactly


def test_column_pushes_shrink_on_a_zipf_vocabulary():
    """On a Zipf-like vocabulary (synthetic_zipf) a batch touches few words: ``auto`` sends columns, >= 5x
    smaller than dense, the same run up to rounding; bf16 values shrink them further."""
    base = LDAConfig(
        n_topics=5, synthetic_docs=2000, synthetic_vocab=10_000, synthetic_doc_len=50, synthetic_zipf=1.2,
        batch_size=100, global_updates=6, log_every=3, heldout_max_docs=30, update_codec="fp32",
    )
    out = {
        name: fit_lda(dataclasses.replace(base, **kw))
        for name, kw in (
            ("dense", {"update_format": "dense"}),
            ("auto", {}),
            ("bf16", {"update_codec": "bf16"}),
        )
    }
    assert out["auto"]["bytes"]["gradients"] * 5 <= out["dense"]["bytes"]["gradients"]
    assert out["bf16"]["bytes"]["gradients"] < 0.6 * out["auto"]["bytes"]["gradients"]
    np.testing.assert_allclose(out["auto"]["lambda"], out["dense"]["lambda"], rtol=1e-3, atol=1e-3)
    assert out["bf16"]["final_perplexity"] == pytest.approx(out["dense"]["final_perplexity"], rel=0.02)


def test_dense_problems_refuse_column_pushes():
    cfg = DPSGDConfig(
        problem="frugalrl.dpsgd.problems:least_squares", workers=1, global_updates=2, update_format="columns",
        startup_timeout_s=30,
    )
    from frugalrl.dpsgd.run import run_dpsgd

    with pytest.raises(Exception, match="column_step"):
        run_dpsgd(cfg)


# ------------------------------------------------------------------------------------ sampling
def test_epoch_sampling_visits_every_document_once_per_pass():
    p = _problem(batch=64)
    rng = np.random.default_rng(0)
    d = p.train.n_docs
    seen = np.concatenate([p.sample_batch(rng) for _ in range(-(-3 * d // 64))])[: 3 * d]
    for k in range(3):
        assert sorted(seen[k * d : (k + 1) * d].tolist()) == list(range(d))
    uniform = _problem(batch=64, sampling="uniform")
    batch = uniform.sample_batch(rng)
    assert np.unique(batch).size == 64
    with pytest.raises(ValueError, match="sampling"):
        _problem(sampling="stratified")
