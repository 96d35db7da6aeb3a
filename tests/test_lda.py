"""DPSVI for LDA (frugalrl.dpsgd.lda) and its corpora (frugalrl.dpsgd.corpora)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from frugalrl.dpsgd.config import DPSGDOptions
from frugalrl.dpsgd.corpora import (
    Corpus,
    load_corpus,
    load_docword,
    load_ldac,
    load_reuters,
    reuters_dir,
    save_docword,
    synthetic_corpus,
)
from frugalrl.dpsgd.lda import (
    LDAConfig,
    LDAProblem,
    completion_perplexity,
    digamma,
    e_step,
    fit_lda,
    match_topics,
    split_halves,
    time_to_target,
)

SMALL = {"n_docs": 600, "vocab": 200, "doc_len": 80, "alpha": 0.1, "eta": 0.05}


# ------------------------------------------------------------------------------------ numerics
def test_digamma_known_values():
    euler = 0.5772156649015329
    x = np.array([1.0, 0.5, 2.0, 1e-3, 10.0, 123.4])
    expected = [-euler, -euler - 2 * math.log(2), 1 - euler, -1000.5755719318103, 2.251752589066721]
    np.testing.assert_allclose(digamma(x)[:5], expected, rtol=0, atol=1e-10)
    # recurrence ψ(x+1) = ψ(x) + 1/x far from the shift region
    np.testing.assert_allclose(digamma(x + 1) - digamma(x), 1 / x, rtol=1e-10)


def _reference_lambda_hat(counts: np.ndarray, lam: np.ndarray, alpha: float, topic_prior: float, scale: float):
    """λ̂ by the textbook per-document, per-word loops (Hoffman et al. 2013, Fig. 6)."""
    k, v = lam.shape
    elog_beta = np.array([[digamma(lam[i, w]) - digamma(lam[i].sum()) for w in range(v)] for i in range(k)])
    s = np.zeros((k, v))
    for doc in counts:
        gamma = np.ones(k)
        for _ in range(2000):
            elog_theta = digamma(gamma) - digamma(gamma.sum())
            phi = np.zeros((v, k))
            for w in range(v):
                if doc[w]:
                    logits = elog_theta + elog_beta[:, w]
                    phi[w] = np.exp(logits - logits.max())
                    phi[w] /= phi[w].sum()
            new = alpha + doc @ phi
            done = np.abs(new - gamma).max() < 1e-13
            gamma = new
            if done:
                break
        s += (doc[:, None] * phi).T
    return topic_prior + scale * s


def test_svi_step_matches_closed_form(tmp_path):
    counts = np.array([[3, 0, 1], [0, 2, 2], [1, 1, 0], [4, 1, 2]])
    path = str(tmp_path / "docword.tiny.txt")
    save_docword(Corpus.from_dense(counts), path)
    problem = LDAProblem(
        corpus=path,
        n_topics=2,
        alpha=0.3,
        topic_prior=0.2,
        batch_size=3,
        heldout_fraction=0.25,
        e_step_iters=5000,
        e_step_tol=1e-12,
        seed=1,
    )
    assert problem.train.n_docs == 3
    lam = np.array([[1.5, 0.7, 2.0], [0.4, 1.9, 1.1]], dtype=np.float32)
    train = problem.train.to_dense()
    expected = _reference_lambda_hat(train, lam.astype(np.float64), 0.3, 0.2, scale=3 / 3)
    grad = problem.stochastic_grad(lam.ravel(), np.random.default_rng(0)).reshape(2, 3)
    np.testing.assert_allclose(grad, lam - expected, rtol=1e-5, atol=1e-5)
    eta = 0.3  # the worker's step u - eta * grad is SVI's (1 - eta) λ + eta λ̂
    np.testing.assert_allclose(lam - eta * grad, (1 - eta) * lam + eta * expected, rtol=1e-5, atol=1e-5)
    # a batch of one document is scaled by D / |G| = 3
    single = problem.lambda_hat(lam.ravel(), np.array([1]))
    ref1 = _reference_lambda_hat(train[1:2], lam.astype(np.float64), 0.3, 0.2, scale=3.0)
    np.testing.assert_allclose(single, ref1, rtol=1e-6)


def test_e_step_handles_empty_documents():
    corpus = Corpus.from_dense(np.array([[0, 0, 0], [2, 0, 1]]))
    beta = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    gamma, s = e_step(corpus, beta, alpha=0.5)
    np.testing.assert_allclose(gamma[0], [0.5, 0.5])
    np.testing.assert_allclose(gamma[1].sum(), 0.5 * 2 + 3, rtol=1e-9)
    np.testing.assert_allclose(s.sum(), 3, rtol=1e-9)  # the φ's of each word sum to its count
    np.testing.assert_allclose(s.sum(axis=0), [2, 0, 1], rtol=1e-9)


# -------------------------------------------------------------------------------- perplexity / fit
def _serial_svi(problem: LDAProblem, steps: int, eta: float, seed: int = 0):
    lam = problem.init_params()
    rng = np.random.default_rng(seed)
    curve = [problem.loss(lam)]
    for i in range(steps):
        lam = lam - np.float32(eta) * problem.stochastic_grad(lam, rng)
        assert lam.min() > 0
        if (i + 1) % 10 == 0:
            curve.append(problem.loss(lam))
    return lam, curve


def test_svi_recovers_synthetic_topics_and_perplexity_decreases():
    # Seeded, so deterministic. SVI can land in a local optimum that merges two true topics (about a
    # third of the seeds at this size); seed 0 does not.
    problem = LDAProblem(n_topics=5, batch_size=64, synthetic=SMALL, seed=0, sampling="uniform")
    lam, curve = _serial_svi(problem, steps=40, eta=0.5)
    assert curve[-1] < 0.5 * curve[0]
    assert curve[-1] < min(curve[:2])
    cos = match_topics(problem.topics(lam), problem.true_topics)
    assert (cos >= 0.9).sum() >= 4, cos
    # the true model is a lower bound to aim at: the fit gets within 15% of its perplexity
    true_ppl = problem.loss((problem.true_topics * 1e5).ravel().astype(np.float32))
    assert curve[-1] < 1.15 * true_ppl, (curve[-1], true_ppl)


def test_completion_perplexity_of_uniform_topics_is_vocab_size():
    corpus, _ = synthetic_corpus(n_docs=20, vocab=50, K=3, doc_len=30, seed=0)
    obs, held = split_halves(corpus, seed=0)
    assert obs.n_tokens + held.n_tokens == corpus.n_tokens
    assert abs(obs.n_tokens - held.n_tokens) <= corpus.n_docs
    ppl = completion_perplexity(np.ones((3, 50)), obs, held, alpha=0.1)
    assert ppl == pytest.approx(50.0, rel=1e-9)


def test_match_topics_is_permutation_invariant():
    rng = np.random.default_rng(0)
    true = rng.dirichlet(np.full(30, 0.1), size=4)
    np.testing.assert_allclose(match_topics(3.0 * true[[2, 0, 3, 1]], true), 1.0)


def test_fit_lda_runs_dpsgd(tmp_path):
    cfg = LDAConfig(
        n_topics=5,
        workers=1,
        processes=2,
        local_steps=2,
        master_batch=1,
        rho=1.0,
        eta=0.3,
        global_updates=8,
        log_every=4,
        synthetic_docs=400,
        synthetic_vocab=150,
        seed=2,
    )
    out = fit_lda(cfg)
    assert out["global_updates"] == 8
    assert out["final_perplexity"] < out["initial_perplexity"]
    assert out["time_to_target_s"] is None
    assert out["lambda"].shape == (5, 150) and out["lambda"].min() > 0
    assert len(out["top_words"]) == 5 and len(out["top_words"][0]) == 10
    assert len(out["topic_recovery"]) == 5
    assert out["bytes"]["total"] > 0
    assert out["eta"] == 0.3 and "lr" not in out  # DPSGD's local rate, under its own name
    assert out["config"]["processes"] == 2 and out["config"]["topic_prior"] is None
    assert time_to_target([(0.0, 0, 9.0), (1.5, 4, 5.0)], 6.0) == 1.5
    assert time_to_target([(0.0, 0, 9.0)], 6.0) is None


def test_lda_config_validates():
    with pytest.raises(ValueError, match="n_topics"):
        LDAConfig(n_topics=0)
    with pytest.raises(ValueError, match="corpus"):
        LDAConfig(corpus="/no/such/file.txt")
    with pytest.raises(ValueError, match="heldout_fraction"):
        LDAConfig(heldout_fraction=1.0)
    with pytest.raises(ValueError, match="topic_prior"):
        LDAConfig(topic_prior=0.0)
    with pytest.raises(ValueError, match=r"^LDAConfig\.processes must be an integer >= 1, got 0$"):
        LDAConfig(processes=0)
    # The DPSGD options are inherited (LDA's defaults), and all of them reach the DPSGD run.
    cfg = LDAConfig(processes=2, eta_decay=0.7, eta_offset=5.0, rescale_from=(1, 1, 1), pull_codec="fp16")
    assert (cfg.workers, cfg.eta, cfg.global_updates, cfg.update_format) == (1, 1.0, 200, "auto")
    assert (LDAConfig().eta_decay, LDAConfig().eta_offset, LDAConfig().batch_size) == (0.5, 1.0, 2000)
    dcfg = cfg.dpsgd_config()
    for f in dataclasses.fields(DPSGDOptions):
        assert getattr(dcfg, f.name) == getattr(cfg, f.name), f.name
    assert dcfg.problem_kwargs["topic_prior"] is None and dcfg.target_loss is None


# ------------------------------------------------------------------------------------- corpora
def test_synthetic_corpus_is_deterministic_and_shaped():
    a, topics = synthetic_corpus(n_docs=50, vocab=40, K=3, doc_len=20, seed=7)
    b, _ = synthetic_corpus(n_docs=50, vocab=40, K=3, doc_len=20, seed=7)
    assert a.n_docs == 50 and a.n_words == 40 and topics.shape == (3, 40)
    np.testing.assert_allclose(topics.sum(axis=1), 1.0)
    np.testing.assert_array_equal(a.to_dense(), b.to_dense())
    assert np.all(np.diff(a.indptr) > 0)


def test_zipf_synthetic_corpus_is_deterministic_shaped_and_zipf_like():
    kw = {"n_docs": 2000, "vocab": 10_000, "K": 5, "doc_len": 50}
    a, topics = synthetic_corpus(**kw, seed=3, zipf=1.2)
    b, _ = synthetic_corpus(**kw, seed=3, zipf=1.2)
    c, _ = synthetic_corpus(**kw, seed=4, zipf=1.2)
    assert a.n_docs == 2000 and a.n_words == 10_000 and topics.shape == (5, 10_000)
    assert a.vocab is not None and len(a.vocab) == 10_000
    np.testing.assert_allclose(topics.sum(axis=1), 1.0)
    for name in ("indptr", "word_ids", "counts"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not (a.word_ids.size == c.word_ids.size and np.array_equal(a.word_ids, c.word_ids))
    assert np.all(np.diff(a.indptr) > 0)
    assert abs(a.n_tokens / a.n_docs - 50) < 2  # Poisson(50) lengths
    # word frequencies fall off as a power of the rank, with about the exponent asked for
    counts = np.bincount(a.word_ids, weights=a.counts, minlength=a.n_words)
    ranked = np.sort(counts)[::-1][:1000]
    slope = np.polyfit(np.log(np.arange(1, 1001)), np.log(ranked), 1)[0]
    assert -1.4 < slope < -1.0
    assert counts[:10].sum() > counts[-5000:].sum()  # id 0 is the most frequent word, on average
    # a batch of 100 documents touches a small share of the vocabulary
    assert np.unique(a.subset(np.arange(100)).word_ids).size < 0.15 * a.n_words


def test_zipf_zero_is_the_original_generator():
    kw = {"n_docs": 40, "vocab": 30, "K": 3, "doc_len": 20, "seed": 5}
    a, ta = synthetic_corpus(**kw)
    b, tb = synthetic_corpus(**kw, zipf=0.0)
    np.testing.assert_array_equal(a.to_dense(), b.to_dense())
    np.testing.assert_array_equal(ta, tb)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="zipf"):
            synthetic_corpus(**kw, zipf=bad)
    with pytest.raises(ValueError, match="synthetic_zipf"):
        LDAConfig(synthetic_zipf=-0.5)
    assert LDAConfig().synthetic_zipf == 0.0
    assert LDAConfig(synthetic_zipf=1.1).problem_kwargs()["synthetic"]["zipf"] == 1.1
    p = LDAProblem(n_topics=3, synthetic={"n_docs": 300, "vocab": 2000, "doc_len": 30, "zipf": 1.1})
    assert p.n_words == 2000 and p.train.n_docs + p.heldout.n_docs == 300


@pytest.mark.parametrize("name", ["docword.toy.txt", "docword.toy.txt.gz", "plain.txt"])
def test_docword_round_trip(tmp_path, name):
    corpus, _ = synthetic_corpus(n_docs=30, vocab=25, K=3, doc_len=15, seed=1)
    path = str(tmp_path / name)
    save_docword(corpus, path)
    back = load_corpus(path)
    np.testing.assert_array_equal(back.to_dense(), corpus.to_dense())
    assert back.vocab == corpus.vocab
    with open(path, "rb") as f:
        raw = f.read()
    if not name.endswith(".gz"):
        assert raw.splitlines()[:3] == [b"30", b"25", str(corpus.word_ids.size).encode()]


def test_docword_sums_duplicates_and_keeps_empty_documents(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("3\n4\n3\n1 2 1\n3 4 5\n1 2 2\n")
    c = load_docword(str(path))
    assert c.vocab is None
    np.testing.assert_array_equal(c.to_dense(), [[0, 3, 0, 0], [0, 0, 0, 0], [0, 0, 0, 5]])
    np.testing.assert_array_equal(c.subset([2, 0]).to_dense(), [[0, 0, 0, 5], [0, 3, 0, 0]])


def test_ldac_and_reuters_layout(tmp_path):
    (tmp_path / "reuters.ldac").write_text("2 0:1 3:2\n1 1:4\n")
    (tmp_path / "reuters.tokens").write_text("alpha\nbeta\ngamma\ndelta\nepsilon\n")
    c = load_reuters(str(tmp_path))
    assert c.n_docs == 2 and c.n_words == 5 and c.vocab[3] == "delta"
    np.testing.assert_array_equal(c.to_dense(), [[1, 0, 0, 2, 0], [0, 4, 0, 0, 0]])
    assert load_ldac(str(tmp_path / "reuters.ldac")).n_words == 4


@pytest.mark.skipif(reuters_dir() is None, reason="the 'lda' package (Reuters data) is not installed")
def test_installed_reuters():
    c = load_reuters()
    assert (c.n_docs, c.n_words) == (395, 4258)


def test_cli_lda_fit_synthetic(tmp_path, capsys):
    from frugalrl.cli import main

    out = tmp_path / "lda.json"
    assert (
        main(
            [
                "lda",
                "fit",
                "synthetic",
                "--global-updates",
                "20",
                "--synthetic-docs",
                "300",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "held-out perplexity" in capsys.readouterr().out
    assert json.loads(out.read_text())["final_perplexity"] > 0
    assert main(["lda", "fit", str(tmp_path / "missing.txt")]) == 2
