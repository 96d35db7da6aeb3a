"""DPSVI: stochastic variational inference for LDA run by DPSGD (the DPSGD paper, Sec. 4.1, App. 7).

The global variational parameter is ``λ`` (``K × V`` Dirichlet parameters of the topics, flattened to
float32). SVI (Hoffman, Blei, Wang & Paisley 2013, Alg. 1 and Sec. 4) samples a batch ``G`` of
``|G|`` documents, fits their local parameters ``γ_d, φ_dw`` with ``λ`` fixed (the E-step), forms

    λ̂ = η + (D / |G|) Σ_{d∈G} Σ_w n_dw φ_dw                                     (paper eq. 52)

(``η`` here is LDA's topic prior, ``topic_prior`` in the code; the paper writes it ζ.)

and steps ``λ ← (1 − ρ_t) λ + ρ_t λ̂``. As a DPSGD :class:`~frugalrl.dpsgd.problems.Problem`,
:class:`LDAProblem` returns the negative natural gradient ``λ − λ̂`` (App. 7, Alg. 4, line 9), so
that the worker's step ``u ← u − η (u − λ̂)`` *is* the SVI step with DPSGD's local rate ``η``, and
the master's ``v ← v + ρ Σ_m w_m`` combines ``M`` of them. The expectations are taken at
``max(λ, topic_prior)``: ``λ̂ ≥ topic_prior`` always, so any convex combination stays above the prior, and a clamp only matters
when aggressive rates (``ρ · η · M > 1``) or stale Hogwild reads overshoot.

The loss is the held-out perplexity by *document completion* (Hoffman et al. 2013, Sec. 4.1). Off the batch's
words ``λ̂ = topic_prior``, so a push can be one decay factor plus the ``K × |batch words|`` columns the batch
changed (:class:`~frugalrl.dpsgd.sparse.ColumnUpdate`, :meth:`LDAProblem.column_step`). Run it with
:func:`fit_lda` (an :class:`LDAConfig`); the maths and design: docs/dpsgd.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import numpy as np

from frugalrl.dpsgd.config import ColumnBaseOption, DPSGDConfig, DPSGDOptions, UpdateCodec, UpdateFormat
from frugalrl.dpsgd.corpora import Corpus, load_corpus, synthetic_corpus
from frugalrl.dpsgd.lda_estep import (
    E_STEP_BACKENDS,
    EStepBackend,
    digamma,
    dirichlet_expectation,
    e_step,
    resolve_backend,
    warm_up,
)
from frugalrl.dpsgd.run import run_dpsgd

Sampling = Literal["epochs", "uniform"]
"""How a batch's documents are drawn (:meth:`LDAProblem.sample_batch`)."""
SAMPLINGS: tuple[str, ...] = get_args(Sampling)

Init = Literal["seeded", "random"]
"""How ``λ`` starts (:meth:`LDAProblem.init_params`): random, or random plus one seed document per topic."""
INITS: tuple[str, ...] = get_args(Init)

PROBLEM = "frugalrl.dpsgd.lda:lda_problem"
"""The factory DPSGD workers build :class:`LDAProblem` from."""


# ------------------------------------------------------------------------------------- numerics
# digamma, dirichlet_expectation and e_step live in frugalrl.dpsgd.lda_estep (numba or numpy); re-exported here.


def split_halves(corpus: Corpus, seed: int) -> tuple[Corpus, Corpus]:
    """Split each document's tokens at random into an observed half and a held-out half (document
    completion); documents with fewer than 2 tokens are dropped."""
    rng = np.random.default_rng(seed)
    obs: tuple[list[int], list[int], list[float]] = ([], [], [])
    held: tuple[list[int], list[int], list[float]] = ([], [], [])
    n = 0
    for d in range(corpus.n_docs):
        ids, cts = corpus.doc(d)
        tokens = np.repeat(ids, cts.astype(np.int64))
        if tokens.size < 2:
            continue
        tokens = rng.permutation(tokens)
        half = tokens.size // 2
        for target, part in ((obs, tokens[:half]), (held, tokens[half:])):
            w, c = np.unique(part, return_counts=True)
            target[0].extend([n] * w.size)
            target[1].extend(w.tolist())
            target[2].extend(c.tolist())
        n += 1
    return (
        Corpus.from_triples(*obs, n, corpus.n_words, corpus.vocab),
        Corpus.from_triples(*held, n, corpus.n_words, corpus.vocab),
    )


def completion_perplexity(
    lam: np.ndarray,
    observed: Corpus,
    heldout: Corpus,
    alpha: float,
    max_iter: int = 100,
    tol: float = 1e-3,
    backend: str = "auto",
) -> float:
    """Held-out perplexity by document completion: ``γ`` fitted on ``observed`` with ``λ`` fixed,
    ``exp(−Σ n log Σ_k E[θ_k] E[β_kw] / Σ n)`` over ``heldout`` (same documents, other words)."""
    lam = np.asarray(lam, dtype=np.float64)
    gamma, _ = e_step(
        observed, np.exp(dirichlet_expectation(lam)), alpha, max_iter, tol, sstats=False,
        rng=np.random.default_rng(0), backend=backend,  # the same start for every λ scored
    )
    theta = gamma / gamma.sum(axis=1, keepdims=True)
    beta = lam / lam.sum(axis=1, keepdims=True)
    p = np.einsum("jk,kj->j", theta[heldout.entry_docs()], beta[:, heldout.word_ids])
    n = heldout.counts.sum()
    return float(math.exp(-float(heldout.counts @ np.log(np.maximum(p, 1e-300))) / n)) if n else float("nan")


def match_topics(learned: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Cosine similarity of each true topic with the learned topic matched to it one-to-one (greedy:
    the most similar remaining pair first). Rows of both are topics (any positive scale)."""
    a = np.asarray(learned, dtype=np.float64)
    b = np.asarray(true, dtype=np.float64)
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    sim = b @ a.T
    out = np.zeros(b.shape[0])
    work = sim.copy()
    for _ in range(min(a.shape[0], b.shape[0])):
        i, j = np.unravel_index(np.argmax(work), work.shape)
        out[i] = sim[i, j]
        work[i, :] = -np.inf
        work[:, j] = -np.inf
    return out


# ------------------------------------------------------------------------------------- the problem
class LDAProblem:
    """SVI for LDA as a DPSGD problem (module docstring). Every process builds the same corpus and
    the same train / held-out split from its arguments.

    ``corpus``: ``"synthetic"`` (drawn by :func:`synthetic_corpus` with ``synthetic`` keyword
    arguments and ``K = n_topics``), ``"reuters"``, or a file path (:func:`load_corpus`).
    """

    def __init__(
        self,
        corpus: str = "synthetic",
        n_topics: int = 10,
        alpha: float | None = None,
        topic_prior: float | None = None,
        batch_size: int = 64,
        heldout_fraction: float = 0.1,
        heldout_max_docs: int = 200,
        e_step_iters: int = 100,
        e_step_tol: float = 1e-3,
        seed: int = 0,
        synthetic: dict[str, Any] | None = None,
        e_step_backend: str = "auto",
        sampling: str = "epochs",
        init: str = "seeded",
        init_seed_weight: float = 0.02,
    ) -> None:
        self.n_topics = int(n_topics)
        self.alpha = float(alpha) if alpha is not None else 1.0 / self.n_topics
        self.topic_prior = float(topic_prior) if topic_prior is not None else 1.0 / self.n_topics
        self.batch_size = int(batch_size)
        self.e_step_iters = int(e_step_iters)
        self.e_step_tol = float(e_step_tol)
        self.e_step_backend = resolve_backend(e_step_backend)
        warm_up(self.e_step_backend)
        if sampling not in SAMPLINGS:
            raise ValueError(f"LDAProblem.sampling must be one of {SAMPLINGS}, got {sampling!r}")
        self.sampling = sampling
        if init not in INITS:
            raise ValueError(f"LDAProblem.init must be one of {INITS}, got {init!r}")
        self.init = init
        self.init_seed_weight = float(init_seed_weight)
        self._perm: np.ndarray | None = None  # "epochs": this process's current pass over the documents
        self._cursor = 0
        self.seed = int(seed)
        self.true_topics: np.ndarray | None = None
        if corpus == "synthetic":
            kwargs = {"seed": self.seed, **(synthetic or {}), "K": self.n_topics}
            full, self.true_topics = synthetic_corpus(**kwargs)
        else:
            full = load_corpus(corpus)
        rng = np.random.default_rng([self.seed, 1])
        order = rng.permutation(full.n_docs)
        n_held = min(int(round(heldout_fraction * full.n_docs)), int(heldout_max_docs))
        if n_held >= full.n_docs:
            raise ValueError(f"held-out set ({n_held} docs) leaves no training documents")
        self.train = full.subset(np.sort(order[n_held:]))
        self.observed, self.heldout = split_halves(full.subset(np.sort(order[:n_held])), self.seed)
        self.n_words = full.n_words
        self.vocab = full.vocab

    @property
    def shape(self) -> tuple[int, int]:
        """``(K, V)``."""
        return self.n_topics, self.n_words

    @property
    def column_shape(self) -> tuple[int, int]:
        """``(K, V)``: the parameters as a matrix whose columns (words) a column-sparse push sends."""
        return self.shape

    @property
    def decay_target(self) -> float:
        """Off the batch's words the SVI step decays λ towards this (the topic prior)."""
        return self.topic_prior

    def topics(self, params: np.ndarray) -> np.ndarray:
        """``λ`` as a ``K × V`` float64 matrix, clamped at the topic prior."""
        return np.maximum(np.asarray(params, dtype=np.float64).reshape(self.shape), self.topic_prior)

    def init_params(self) -> np.ndarray:
        """The starting ``λ``, seeded: ``Gamma(100, 1/100)`` elementwise (Hoffman's initialisation), and with
        ``init="seeded"`` (the default) topic ``k`` also gets ``init_seed_weight × V`` pseudo-counts spread as
        the words of one training document, ``k``'s *seed document* (:meth:`seed_documents`).

        Why: from near-uniform topics SVI must break the symmetry between topics itself, and which optimum it
        lands in is a lottery of the first batches; mutually dissimilar seed documents (farthest first, as
        k-means++ seeds clusters) break it along the data (docs/benchmarks.md#lda-seeded). The weight is a
        nudge: the first SVI step (rate 1) replaces ``λ``, only its E-step sees this start.
        """
        rng = np.random.default_rng([self.seed, 2])
        lam = rng.gamma(100.0, 0.01, size=self.n_topics * self.n_words)
        if self.init == "seeded" and self.init_seed_weight > 0:
            mat = lam.reshape(self.shape)
            for k, d in enumerate(self.seed_documents(rng)):
                ids, cts = self.train.doc(int(d))
                mat[k, ids] += self.init_seed_weight * self.n_words * cts / cts.sum()
        return lam.astype(np.float32)

    def seed_documents(self, rng: np.random.Generator, pool_per_topic: int = 50) -> np.ndarray:
        """Up to ``K`` training documents, mutually dissimilar: from a random pool of ``pool_per_topic × K``
        non-empty ones, a random first, then repeatedly the one least similar (cosine of word counts) to its
        most similar pick so far (farthest-first traversal, the deterministic k-means++)."""
        lengths = np.diff(self.train.indptr)
        candidates = np.flatnonzero(lengths > 0)
        if not candidates.size:
            return candidates
        pool = np.sort(rng.choice(candidates, size=min(candidates.size, pool_per_topic * self.n_topics),
                                  replace=False))
        docs = self.train.subset(pool)
        owner = docs.entry_docs()
        vals = docs.counts.astype(np.float64)
        vals = vals / np.sqrt(np.bincount(owner, vals * vals, minlength=docs.n_docs))[owner]
        dense = np.zeros(docs.n_words)

        def similarity(j: int) -> np.ndarray:  # cosine of pool document j with every pool document
            a, b = docs.indptr[j], docs.indptr[j + 1]
            dense[docs.word_ids[a:b]] = vals[a:b]
            out = np.bincount(owner, vals * dense[docs.word_ids], minlength=docs.n_docs)
            dense[docs.word_ids[a:b]] = 0.0
            return out

        chosen = [int(rng.integers(docs.n_docs))]
        nearest = similarity(chosen[0])
        while len(chosen) < min(self.n_topics, docs.n_docs):
            chosen.append(int(np.argmin(nearest)))
            nearest = np.maximum(nearest, similarity(chosen[-1]))
        return pool[chosen]

    def lambda_hat_columns(
        self, params: np.ndarray, docs: np.ndarray, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(words, λ̂[:, words] − topic_prior)``: the batch's distinct words and eq. (52) at them, less the
        prior (elsewhere λ̂ is the prior). See :meth:`lambda_hat`."""
        lam = self.topics(params)
        batch = self.train.subset(docs)
        words, local = np.unique(batch.word_ids, return_inverse=True)
        local_batch = Corpus(batch.indptr, local.reshape(-1), batch.counts, words.size)
        elog = digamma(lam[:, words]) - digamma(lam.sum(axis=1, keepdims=True))
        _, s = e_step(
            local_batch, np.exp(elog), self.alpha, self.e_step_iters, self.e_step_tol, rng=rng,
            backend=self.e_step_backend,
        )
        assert s is not None
        return words, (self.train.n_docs / max(1, len(docs))) * s

    def lambda_hat(
        self, params: np.ndarray, docs: np.ndarray, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        """Eq. (52): ``η + (D/|G|) Σ_{d∈G} n_dw φ_dwk`` for the training documents ``docs``.

        ``exp(E[log β])`` is needed only at the batch's words: ``ψ`` is evaluated on those columns of
        ``λ`` (and its row sums), not on all ``K × V`` entries, and the E-step runs on the batch
        relabelled to them.
        """
        words, extra = self.lambda_hat_columns(params, docs, rng)
        out = np.full(self.shape, self.topic_prior)
        out[:, words] += extra
        return out

    def sample_batch(self, rng: np.random.Generator) -> np.ndarray:
        """``batch_size`` training documents (all of them if fewer).

        ``sampling="epochs"``: the next ones of a pass over the documents in an order drawn from ``rng``
        anew for every pass (without replacement, as scikit-learn's and gensim's passes go; a batch that
        spans two passes takes the rest of one and the start of the next); ``"uniform"``: distinct documents
        drawn afresh for each batch (Hoffman et al. 2013, Alg. 1). Passes settle in better optima
        (docs/benchmarks.md#lda-defaults).
        """
        d = self.train.n_docs
        size = min(self.batch_size, d)
        if self.sampling == "uniform":
            return rng.choice(d, size=size, replace=False)
        parts = []
        while size:
            if self._perm is None or self._cursor >= d:
                self._perm, self._cursor = rng.permutation(d), 0
            take = min(size, d - self._cursor)
            parts.append(self._perm[self._cursor : self._cursor + take])
            self._cursor += take
            size -= take
        return np.concatenate(parts)

    def stochastic_grad(self, params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``λ − λ̂`` on a random batch: the step ``λ − η (λ − λ̂)`` is SVI's."""
        lam_hat = self.lambda_hat(params, self.sample_batch(rng), rng).ravel()
        return (np.asarray(params, dtype=np.float64) - lam_hat).astype(np.float32)

    def column_step(self, u: np.ndarray, eta: float, rng: np.random.Generator) -> np.ndarray:
        """One SVI step ``u ← u − η (u − λ̂)`` on a random batch, in place on the flat float32 ``u``,
        computed as ``u ← (1 − η) u + η · topic_prior`` everywhere plus ``η (λ̂ − topic_prior)`` on the
        batch's words; returns those words (the columns a column-sparse push must send)."""
        words, extra = self.lambda_hat_columns(u.copy(), self.sample_batch(rng), rng)
        mat = u.reshape(self.shape)
        mat *= np.float32(1.0 - eta)
        mat += np.float32(eta * self.topic_prior)
        mat[:, words] += (eta * extra).astype(np.float32)
        return words

    def perplexity(self, params: np.ndarray) -> float:
        """Held-out perplexity by document completion (module docstring)."""
        return completion_perplexity(
            self.topics(params), self.observed, self.heldout, self.alpha, self.e_step_iters, self.e_step_tol,
            backend=self.e_step_backend,
        )

    def loss(self, params: np.ndarray) -> float:
        """The held-out perplexity."""
        return self.perplexity(params)

    def top_words(self, params: np.ndarray, n: int = 10) -> list[list[str]]:
        """The ``n`` most probable words of each topic."""
        lam = self.topics(params)
        vocab = self.vocab or [f"w{i}" for i in range(self.n_words)]
        return [[vocab[i] for i in np.argsort(-row)[:n]] for row in lam]


def lda_problem(**kwargs: Any) -> LDAProblem:
    """Factory of :class:`LDAProblem` (``"frugalrl.dpsgd.lda:lda_problem"``)."""
    return LDAProblem(**kwargs)


# ------------------------------------------------------------------------------------- the run
@dataclass
class LDAConfig(DPSGDOptions):
    """A DPSVI run of LDA (the paper's symbols in brackets; defaults suit the synthetic corpus).

    The DPSGD options are :class:`~frugalrl.dpsgd.config.DPSGDOptions`' own, with LDA's defaults. DPSGD's
    local rate ``eta`` is the SVI step ``λ ← (1 − η) λ + η λ̂`` with SVI's Robbins-Monro schedule
    ``η_t = eta (1 + t/eta_offset)^(−eta_decay)`` (Hoffman et al. 2013); the defaults ``1, 0.5, 1`` give
    ``η_t = (1 + t)^(−1/2)``, gensim's ``decay=0.5, offset=1`` (``eta_decay=0``: the DPSGD paper's constant
    rate, 0.1 there). Pushes are column-sparse (``update_format``, :mod:`frugalrl.dpsgd.sparse`). Keep
    ``rho * eta * master_batch <= 1`` so that λ stays a convex combination. The Dirichlet prior on the
    topics, often written η too, is ``topic_prior`` here.
    """

    workers: int = 1
    eta: float = 1.0
    eta_decay: float = 0.5
    eta_offset: float = 1.0
    global_updates: int | None = 200
    update_format: UpdateFormat = "auto"
    update_codec: UpdateCodec = "bf16+zstd"
    """Wire codec of the pushed updates; LDA's default, bf16 values (which leave the final perplexity where fp32 puts
    it: docs/benchmarks.md#lda-bf16), compressed losslessly."""
    column_base: ColumnBaseOption = "auto"
    """What a column push's decay applies to on the server (:mod:`frugalrl.dpsgd.sparse`); ``auto`` (the default):
    ``current`` with several workers, so that a stale SVI step is still a convex combination of the server's
    current ``λ`` and ``λ̂`` (as in gensim's ``LdaMulticore``) rather than an overshoot (with ``pulled`` and rate
    1 at t = 0, two workers' first steps *add*: ``λ2 = λ̂_A + λ̂_B − λ0``; docs/benchmarks.md#lda-seeded).
    ``pulled`` with one worker, where both are the same and it keeps the dense fallback of a batch that covers
    the vocabulary."""
    corpus: str = "synthetic"
    """``"synthetic"``, ``"reuters"`` (needs the ``lda`` package), or a UCI docword / ``.ldac`` file."""
    n_topics: int = 10
    """Number of topics (K); the paper uses 50."""
    alpha: float | None = None
    """Dirichlet prior on each document's topic proportions (α); None: 1/K."""
    topic_prior: float | None = None
    """η of LDA (ζ of eq. 52): the Dirichlet prior on each topic's word distribution; None: 1/K."""
    batch_size: int = 2000
    """Documents per stochastic gradient (G of eq. 52; all of them if the corpus has fewer). The DPSGD paper
    uses 64; 2000 is gensim's default chunk, which the default rate schedule needs: smaller batches want a
    smaller ``eta`` (why: docs/benchmarks.md#lda-defaults)."""
    target_perplexity: float | None = None
    """Stop once the held-out perplexity reaches this (``time_to_target_s`` says when)."""
    log_every: int = 10
    """Evaluate the held-out perplexity every this many global updates."""
    heldout_fraction: float = 0.1
    """Share of the documents held out for the perplexity."""
    heldout_max_docs: int = 200
    """At most this many held-out documents (keeps each evaluation cheap)."""
    e_step_iters: int = 100
    """Most iterations of each local (γ, φ) fit."""
    e_step_tol: float = 1e-3
    """A document's local fit stops when the mean change of its γ is below this."""
    sampling: Sampling = "epochs"
    """Batches: ``epochs`` (passes over the documents, each in a new random order, per Hogwild process) or
    ``uniform`` (independent random batches, as in Hoffman et al. 2013); see :meth:`LDAProblem.sample_batch`."""
    init: Init = "seeded"
    """``λ``'s start: ``random`` (``Gamma(100, 1/100)``, Hoffman's) or ``seeded`` (that, plus ``init_seed_weight``
    of each topic's mass on the words of one training document, the documents chosen mutually dissimilar);
    seeded settles in better optima, see :meth:`LDAProblem.init_params`."""
    init_seed_weight: float = 0.02
    """``init="seeded"``: the seed document's pseudo-counts, as a fraction of a random topic's mass (``V``)."""
    e_step_backend: EStepBackend = "auto"
    """E-step implementation: ``numba`` (compiled, per document), ``numpy`` (vectorised over the batch) or
    ``auto`` (numba where installed); both compute the same fit (:mod:`frugalrl.dpsgd.lda_estep`)."""
    seed: int = 0
    """Seed of the synthetic corpus, the split, λ's initialisation and every sample stream."""
    synthetic_docs: int = 2000
    """Synthetic corpus: number of documents."""
    synthetic_vocab: int = 500
    """Synthetic corpus: vocabulary size."""
    synthetic_doc_len: int = 100
    """Synthetic corpus: mean document length (Poisson)."""
    synthetic_alpha: float = 0.1
    """Synthetic corpus: true α of the generating model."""
    synthetic_eta: float = 0.05
    """Synthetic corpus: true η (topic prior) of the generating model."""
    synthetic_zipf: float = 0.0
    """Synthetic corpus: > 0 gives a Zipf-like vocabulary, word ``w``'s mean frequency ``∝ (w + 1)^(−synthetic_zipf)``,
    drawn token by token (fast for 100,000 documents over tens of thousands of words); 0 (the default): the
    original symmetric ``Dir(synthetic_eta)`` topics (:func:`~frugalrl.dpsgd.corpora.synthetic_corpus`)."""
    top_words: int = 10
    """Words listed per topic in the summary."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        for name in ("n_topics", "batch_size", "heldout_max_docs", "e_step_iters", "top_words"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LDAConfig.{name} must be an integer >= 1, got {value!r}")
        for name in ("alpha", "topic_prior", "target_perplexity"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"LDAConfig.{name} must be a number > 0 or None, got {value!r}")
        if not (isinstance(self.synthetic_zipf, (int, float)) and 0 <= self.synthetic_zipf < math.inf):
            raise ValueError(f"LDAConfig.synthetic_zipf must be a finite number >= 0, got {self.synthetic_zipf!r}")
        if not 0 < self.heldout_fraction < 1:
            raise ValueError(f"LDAConfig.heldout_fraction must lie in (0, 1), got {self.heldout_fraction!r}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"LDAConfig.sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if self.init not in INITS:
            raise ValueError(f"LDAConfig.init must be one of {INITS}, got {self.init!r}")
        if not (isinstance(self.init_seed_weight, (int, float)) and 0 <= self.init_seed_weight < math.inf):
            raise ValueError(f"LDAConfig.init_seed_weight must be a finite number >= 0, got {self.init_seed_weight!r}")
        if self.e_step_backend not in E_STEP_BACKENDS:
            raise ValueError(f"LDAConfig.e_step_backend must be one of {E_STEP_BACKENDS}, got {self.e_step_backend!r}")
        try:
            resolve_backend(self.e_step_backend)
        except ValueError as e:
            raise ValueError(f"LDAConfig.e_step_backend: {e}") from None
        if self.corpus not in ("synthetic", "reuters") and not os.path.exists(self.corpus):
            raise ValueError(f"LDAConfig.corpus: no file {self.corpus!r} (or use 'synthetic' / 'reuters')")
        super().validate()

    def problem_kwargs(self) -> dict[str, Any]:
        """The JSON arguments of :func:`lda_problem`."""
        corpus = self.corpus if self.corpus in ("synthetic", "reuters") else os.path.abspath(self.corpus)
        return {
            "corpus": corpus,
            "n_topics": self.n_topics,
            "alpha": self.alpha,
            "topic_prior": self.topic_prior,
            "batch_size": self.batch_size,
            "heldout_fraction": self.heldout_fraction,
            "heldout_max_docs": self.heldout_max_docs,
            "e_step_iters": self.e_step_iters,
            "e_step_tol": self.e_step_tol,
            "e_step_backend": self.e_step_backend,
            "sampling": self.sampling,
            "init": self.init,
            "init_seed_weight": self.init_seed_weight,
            "seed": self.seed,
            "synthetic": {
                "n_docs": self.synthetic_docs,
                "vocab": self.synthetic_vocab,
                "doc_len": self.synthetic_doc_len,
                "alpha": self.synthetic_alpha,
                "eta": self.synthetic_eta,
                "zipf": self.synthetic_zipf,
            },
        }

    def dpsgd_config(self) -> DPSGDConfig:
        """The :class:`~frugalrl.dpsgd.config.DPSGDConfig` of this run: the inherited options, the LDA problem."""
        return DPSGDConfig(
            **self.options(),
            problem=PROBLEM,
            problem_kwargs=self.problem_kwargs(),
            seed=self.seed,
            log_every=self.log_every,
            target_loss=self.target_perplexity,
        )


def time_to_target(curve: list[tuple[float, int, float]], target: float | None) -> float | None:
    """Seconds at which ``curve`` (``(seconds, update, perplexity)``) first reaches ``target``."""
    if target is None:
        return None
    return next((float(t) for t, _, p in curve if p <= target), None)


def fit_lda(cfg: LDAConfig) -> dict[str, Any]:
    """Fit LDA by DPSVI (:func:`~frugalrl.dpsgd.run.run_dpsgd` on :class:`LDAProblem`).

    Returns the DPSGD summary's counters plus: ``perplexity_curve`` ``[(seconds, update,
    perplexity)]``, ``final_perplexity``, ``initial_perplexity``, ``time_to_target_s`` (None if not
    reached / no target), ``top_words`` (per topic), ``lambda`` (``K × V`` float32), ``corpus``
    (``docs``, ``train_docs``, ``heldout_docs``, ``vocab``, ``tokens``), ``topic_recovery`` (synthetic
    only: the matched cosine of each true topic, see :func:`match_topics`) and ``config``.
    """
    dcfg = cfg.dpsgd_config()
    problem = LDAProblem(**dcfg.problem_kwargs)
    summary = run_dpsgd(dcfg, problem)  # one corpus load in this process
    params = summary["params"]
    curve = [(float(t), int(u), float(p)) for t, u, p in summary["loss_curve"]]
    out: dict[str, Any] = {
        "perplexity_curve": curve,
        "initial_perplexity": curve[0][2],
        "final_perplexity": summary["final_loss"],
        "time_to_target_s": None if summary["target"] is None else summary["target"]["seconds"],
        "target_perplexity": cfg.target_perplexity,
        "top_words": problem.top_words(params, cfg.top_words),
        "lambda": np.asarray(params, dtype=np.float32).reshape(problem.shape),
        "corpus": {
            "name": cfg.corpus,
            "docs": problem.train.n_docs + problem.heldout.n_docs,
            "train_docs": problem.train.n_docs,
            "heldout_docs": problem.heldout.n_docs,
            "vocab": problem.n_words,
            "tokens": problem.train.n_tokens,
        },
        "topic_recovery": None,
        "config": asdict(cfg),
    }
    if problem.true_topics is not None:
        out["topic_recovery"] = match_topics(problem.topics(params), problem.true_topics).tolist()
    for key in (
        "global_updates",
        "staleness",
        "bytes",
        "pulls",
        "pushes",
        "applied_updates",
        "dropped_updates",
        "gradient_steps",
        "updates_per_second",
        "wall_time_s",
        "startup_s",
        "stop_reason",
        "rho",
        "eta",
    ):
        out[key] = summary[key]
    return out
