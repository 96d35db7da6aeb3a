"""Bag-of-words corpora for LDA (:mod:`frugalrl.dpsgd.lda`): a synthetic one, files, and Reuters.

A :class:`Corpus` is a document-term matrix in compressed sparse row form, kept as three numpy
arrays (scipy is not a dependency): document ``d`` holds the distinct words
``word_ids[indptr[d]:indptr[d+1]]`` (sorted, int32) with counts ``counts[indptr[d]:indptr[d+1]]``.
:meth:`Corpus.to_scipy` gives a ``scipy.sparse.csr_matrix`` where scipy is installed.

Sources (:func:`load_corpus` picks one from a string):

- ``synthetic_corpus(...)``: documents drawn from a known LDA model, with its true topics;
- a file in the UCI bag-of-words *docword* format (the format of the paper's NYTimes corpus,
  ``docword.nytimes.txt`` + ``vocab.nytimes.txt``; see :func:`load_docword`), optionally gzipped;
- a file in the LDA-C format (``*.ldac``: one document a line, ``N id:count id:count ...``);
- ``"reuters"``: the 395 Reuters news stories (vocabulary 4,258) that the ``lda`` PyPI package ships
  as data files in ``lda/tests/``; they are read directly, without importing ``lda`` (its compiled
  extension is never loaded). Needs ``pip install lda`` (no download happens at run time).
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Corpus:
    """A document-term matrix in CSR form (see the module docstring)."""

    indptr: np.ndarray
    """Start of each document's entries, int64 of length ``n_docs + 1``."""
    word_ids: np.ndarray
    """Word id of each entry, int32, sorted and distinct within a document."""
    counts: np.ndarray
    """Count of each entry, float64 (> 0)."""
    n_words: int
    """Vocabulary size ``V``."""
    vocab: list[str] | None = None
    """Word of each id, if known."""

    def __post_init__(self) -> None:
        self.indptr = np.asarray(self.indptr, dtype=np.int64)
        self.word_ids = np.asarray(self.word_ids, dtype=np.int32)
        self.counts = np.asarray(self.counts, dtype=np.float64)
        self.n_words = int(self.n_words)
        if self.indptr.ndim != 1 or self.indptr.size < 1 or self.indptr[0] != 0:
            raise ValueError("Corpus.indptr must be a flat array starting at 0")
        if np.any(np.diff(self.indptr) < 0) or self.indptr[-1] != self.word_ids.size:
            raise ValueError("Corpus.indptr must be non-decreasing and end at the number of entries")
        if self.word_ids.shape != self.counts.shape:
            raise ValueError("Corpus.word_ids and Corpus.counts must have the same length")
        if self.word_ids.size and (self.word_ids.min() < 0 or self.word_ids.max() >= self.n_words):
            raise ValueError(f"Corpus word ids must lie in [0, {self.n_words})")
        if self.vocab is not None and len(self.vocab) != self.n_words:
            raise ValueError(f"Corpus.vocab has {len(self.vocab)} words, expected {self.n_words}")

    @property
    def n_docs(self) -> int:
        """Number of documents ``D``."""
        return int(self.indptr.size - 1)

    @property
    def n_tokens(self) -> int:
        """Total word count."""
        return int(round(float(self.counts.sum())))

    def entry_docs(self) -> np.ndarray:
        """Document of each entry (int64, length ``nnz``)."""
        return np.repeat(np.arange(self.n_docs), np.diff(self.indptr))

    def doc(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """``(word_ids, counts)`` of document ``d``."""
        a, b = self.indptr[d], self.indptr[d + 1]
        return self.word_ids[a:b], self.counts[a:b]

    def subset(self, docs: Iterable[int]) -> Corpus:
        """The documents ``docs`` (in that order) as a new corpus."""
        docs = np.asarray(list(docs) if not isinstance(docs, np.ndarray) else docs, dtype=np.int64)
        lengths = self.indptr[docs + 1] - self.indptr[docs]
        indptr = np.zeros(docs.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        take = _ranges(self.indptr[docs], lengths)
        return Corpus(indptr, self.word_ids[take], self.counts[take], self.n_words, self.vocab)

    @classmethod
    def from_triples(
        cls,
        doc_ids: Any,
        word_ids: Any,
        counts: Any,
        n_docs: int,
        n_words: int,
        vocab: list[str] | None = None,
    ) -> Corpus:
        """Build from 0-based ``(doc, word, count)`` triples in any order; duplicates are summed,
        zero counts dropped."""
        doc_ids = np.asarray(doc_ids, dtype=np.int64)
        word_ids = np.asarray(word_ids, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.float64)
        if not (doc_ids.shape == word_ids.shape == counts.shape):
            raise ValueError("doc_ids, word_ids and counts must have the same length")
        if doc_ids.size and (doc_ids.min() < 0 or doc_ids.max() >= n_docs):
            raise ValueError(f"document ids must lie in [0, {n_docs})")
        if word_ids.size and (word_ids.min() < 0 or word_ids.max() >= n_words):
            raise ValueError(f"word ids must lie in [0, {n_words})")
        if np.any(counts < 0):
            raise ValueError("counts must be >= 0")
        key = doc_ids * n_words + word_ids
        uniq, inverse = np.unique(key, return_inverse=True)
        summed = np.bincount(inverse, weights=counts, minlength=uniq.size)
        keep = summed > 0
        uniq, summed = uniq[keep], summed[keep]
        docs = uniq // n_words
        indptr = np.zeros(n_docs + 1, dtype=np.int64)
        np.cumsum(np.bincount(docs, minlength=n_docs), out=indptr[1:])
        return cls(indptr, uniq % n_words, summed, n_words, vocab)

    @classmethod
    def from_dense(cls, matrix: Any, vocab: list[str] | None = None) -> Corpus:
        """Build from a dense ``D × V`` count matrix."""
        m = np.asarray(matrix)
        d, w = np.nonzero(m)
        return cls.from_triples(d, w, m[d, w], m.shape[0], m.shape[1], vocab)

    def with_vocab(self, vocab: list[str]) -> Corpus:
        """The same documents with vocabulary ``vocab``."""
        return Corpus(self.indptr, self.word_ids, self.counts, self.n_words, list(vocab))

    def to_dense(self) -> np.ndarray:
        """The ``D × V`` count matrix (float64)."""
        out = np.zeros((self.n_docs, self.n_words))
        out[self.entry_docs(), self.word_ids] = self.counts
        return out

    def to_scipy(self) -> Any:
        """A ``scipy.sparse.csr_matrix`` (needs scipy)."""
        from scipy.sparse import csr_matrix  # noqa: PLC0415 - optional dependency

        return csr_matrix((self.counts, self.word_ids, self.indptr), shape=(self.n_docs, self.n_words))


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each start ``s`` and length ``n``."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(total, dtype=np.int64) + offsets


# ----------------------------------------------------------------------------------- synthetic
def synthetic_corpus(
    n_docs: int = 2000,
    vocab: int = 500,
    K: int = 10,
    doc_len: int = 100,
    alpha: float = 0.1,
    eta: float = 0.05,
    seed: int = 0,
    zipf: float = 0.0,
) -> tuple[Corpus, np.ndarray]:
    """Documents drawn from LDA with ``K`` topics: ``β_k ~ Dir(eta)`` over ``vocab`` words,
    ``θ_d ~ Dir(alpha)``, length ``N_d ~ max(1, Poisson(doc_len))``, words ``~ Mult(N_d, θ_d β)``
    (the bag of words of the usual per-token draw). Returns ``(corpus, topics)``, ``topics`` the
    true ``K × vocab`` word distributions. Deterministic in ``seed``.

    ``zipf > 0``: a Zipf-like vocabulary for large corpora. Word ``w`` (0-based) gets the base frequency
    ``f_w ∝ (w + 1)^(−zipf)`` and each topic draws ``β_kw ∝ f_w · g_kw`` with ``g_kw ~ Gamma(eta)``
    (``zipf = 0`` would be ``Dir(eta)`` again): every word's mean frequency is ``f_w`` (so word ``0`` is
    the most frequent, and corpus counts fall off as a power law of the rank), while ``eta`` keeps the
    topics specific. The documents are then drawn token by token (topic counts ``~ Mult(N_d, θ_d)``, each
    token's word by inverse CDF of its topic), never forming the dense ``n_docs × vocab`` matrix, so
    100,000 documents over 50,000 words take a few seconds. ``zipf = 0`` (the default) is the original
    generator, draw for draw.
    """
    for name, value in (("n_docs", n_docs), ("vocab", vocab), ("K", K), ("doc_len", doc_len)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"synthetic_corpus: {name} must be an integer >= 1, got {value!r}")
    if not (alpha > 0 and eta > 0):
        raise ValueError(f"synthetic_corpus: alpha and eta must be > 0, got {alpha!r}, {eta!r}")
    if not (np.isfinite(zipf) and zipf >= 0):
        raise ValueError(f"synthetic_corpus: zipf must be a finite number >= 0, got {zipf!r}")
    if zipf > 0:
        return _zipf_corpus(n_docs, vocab, K, doc_len, alpha, eta, seed, float(zipf))
    rng = np.random.default_rng(seed)
    topics = _dirichlet(rng, np.full(vocab, float(eta)), K)
    theta = _dirichlet(rng, np.full(K, float(alpha)), n_docs)
    lengths = np.maximum(1, rng.poisson(doc_len, size=n_docs))
    probs = theta @ topics
    probs /= probs.sum(axis=1, keepdims=True)
    counts = np.stack([rng.multinomial(n, p) for n, p in zip(lengths, probs, strict=True)])
    vocab_words = [f"w{i}" for i in range(vocab)]
    return Corpus.from_dense(counts, vocab_words), topics


def zipf_frequencies(vocab: int, exponent: float) -> np.ndarray:
    """``f_w ∝ (w + 1)^(−exponent)`` for ``w < vocab``, summing to 1 (the base frequencies of
    :func:`synthetic_corpus` with ``zipf=exponent``)."""
    f = np.arange(1, vocab + 1, dtype=np.float64) ** (-float(exponent))
    return f / f.sum()


def _zipf_corpus(
    n_docs: int, vocab: int, K: int, doc_len: int, alpha: float, eta: float, seed: int, zipf: float
) -> tuple[Corpus, np.ndarray]:
    """:func:`synthetic_corpus` with ``zipf > 0`` (see there), drawn token by token."""
    rng = np.random.default_rng([seed, 7])  # its own stream: never confused with the zipf = 0 draws
    g = rng.gamma(float(eta), size=(K, vocab)) * zipf_frequencies(vocab, zipf)
    g = np.maximum(g, np.finfo(np.float64).tiny)
    topics = g / g.sum(axis=1, keepdims=True)
    theta = _dirichlet(rng, np.full(K, float(alpha)), n_docs)
    lengths = np.maximum(1, rng.poisson(doc_len, size=n_docs))
    per_topic = rng.multinomial(lengths, theta)  # n_docs × K token counts
    flat = per_topic.ravel()
    docs = np.repeat(np.repeat(np.arange(n_docs, dtype=np.int64), K), flat)
    token_topics = np.repeat(np.tile(np.arange(K), n_docs), flat)
    u = rng.random(docs.size)
    words = np.empty(docs.size, dtype=np.int64)
    cdf = np.cumsum(topics, axis=1)
    cdf /= cdf[:, -1:]
    order = np.argsort(token_topics, kind="stable")
    bounds = np.searchsorted(token_topics[order], np.arange(K + 1))
    for k in range(K):
        idx = order[bounds[k] : bounds[k + 1]]
        words[idx] = np.minimum(np.searchsorted(cdf[k], u[idx], side="right"), vocab - 1)
    corpus = Corpus.from_triples(docs, words, np.ones(docs.size), n_docs, vocab, [f"w{i}" for i in range(vocab)])
    return corpus, topics


def _dirichlet(rng: np.random.Generator, conc: np.ndarray, size: int) -> np.ndarray:
    """Dirichlet draws by normalised gammas, safe for tiny concentrations (no all-zero rows)."""
    g = rng.gamma(conc, size=(size, conc.size))
    g = np.maximum(g, np.finfo(np.float64).tiny)
    return g / g.sum(axis=1, keepdims=True)


# ----------------------------------------------------------------------------------------- files
def _open_text(path: str, mode: str = "rt") -> Any:
    return gzip.open(path, mode) if path.endswith(".gz") else open(path, mode)  # noqa: SIM115


def vocab_path_for(path: str) -> str:
    """Where the vocabulary of docword file ``path`` is looked for / written: ``vocab.X.txt`` next to
    ``docword.X.txt``, else ``<docword file>.vocab``."""
    head, tail = os.path.split(path)
    if tail.startswith("docword."):
        base = tail[len("docword.") :]
        base = base[:-3] if base.endswith(".gz") else base
        return os.path.join(head, "vocab." + base)
    return path + ".vocab"


def save_docword(corpus: Corpus, path: str, write_vocab: bool = True) -> None:
    """Write ``corpus`` in the UCI docword format (gzipped if ``path`` ends in ``.gz``), and its
    vocabulary (if known and ``write_vocab``) to :func:`vocab_path_for` ``(path)``."""
    docs = corpus.entry_docs()
    with _open_text(path, "wt") as f:
        f.write(f"{corpus.n_docs}\n{corpus.n_words}\n{corpus.word_ids.size}\n")
        for d, w, c in zip(docs.tolist(), corpus.word_ids.tolist(), corpus.counts.tolist(), strict=True):
            f.write(f"{d + 1} {w + 1} {int(c) if float(c).is_integer() else c}\n")
    if write_vocab and corpus.vocab is not None:
        with open(vocab_path_for(path), "w") as f:
            f.writelines(word + "\n" for word in corpus.vocab)


def load_docword(path: str, vocab_path: str | None = None) -> Corpus:
    """Read a UCI docword file; the vocabulary from ``vocab_path``, else from :func:`vocab_path_for` ``(path)`` if
    that file exists. The format (all ids 1-based; the vocabulary file has one word a line)::

        D            number of documents
        W            vocabulary size
        NNZ          number of (doc, word, count) lines that follow
        docID wordID count
        ...
    """
    with _open_text(path) as f:
        try:
            n_docs, n_words, nnz = (int(f.readline()) for _ in range(3))
        except ValueError as e:
            raise ValueError(f"{path}: not a UCI docword file (three header lines D, W, NNZ): {e}") from e
        data = np.loadtxt(f, dtype=np.float64, ndmin=2) if nnz else np.zeros((0, 3))
    if data.shape != (nnz, 3):
        raise ValueError(f"{path}: expected {nnz} lines of 'docID wordID count', got shape {data.shape}")
    vocab_path = vocab_path or vocab_path_for(path)
    vocab = _read_vocab(vocab_path) if os.path.exists(vocab_path) else None
    return Corpus.from_triples(data[:, 0] - 1, data[:, 1] - 1, data[:, 2], n_docs, n_words, vocab)


def _read_vocab(path: str) -> list[str]:
    with _open_text(path) as f:
        return [line.strip() for line in f if line.strip()]


def load_ldac(path: str, vocab_path: str | None = None, n_words: int | None = None) -> Corpus:
    """Read an LDA-C file (``N id:count ...`` per document, 0-based ids); the vocabulary (one word a
    line) from ``vocab_path`` if given. ``n_words`` defaults to the vocabulary's size, else the
    largest id + 1."""
    docs: list[int] = []
    words: list[int] = []
    counts: list[float] = []
    n_docs = 0
    with _open_text(path) as f:
        for line in f:
            if not line.strip():
                continue
            for item in line.split()[1:]:
                w, c = item.split(":")
                docs.append(n_docs)
                words.append(int(w))
                counts.append(float(c))
            n_docs += 1
    vocab = _read_vocab(vocab_path) if vocab_path else None
    if n_words is None:
        n_words = len(vocab) if vocab is not None else (max(words) + 1 if words else 1)
    return Corpus.from_triples(docs, words, counts, n_docs, n_words, vocab)


def reuters_dir() -> str | None:
    """Folder of the Reuters data files of the installed ``lda`` package, or None (not installed).
    Found without importing ``lda``."""
    spec = importlib.util.find_spec("lda")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = os.path.join(list(spec.submodule_search_locations)[0], "tests")
    return folder if os.path.exists(os.path.join(folder, "reuters.ldac")) else None


def load_reuters(folder: str | None = None) -> Corpus:
    """The 395 Reuters stories shipped by the ``lda`` package (``reuters.ldac`` + ``reuters.tokens``),
    read from ``folder`` or from the installed package. Raises ``FileNotFoundError`` with the fix."""
    folder = folder or reuters_dir()
    if folder is None:
        raise FileNotFoundError(
            "corpus 'reuters' needs the data files of the 'lda' package: pip install 'lda>=3.0.2'"
        )
    tokens = os.path.join(folder, "reuters.tokens")
    with open(tokens) as f:
        vocab = f.read().split()
    return load_ldac(os.path.join(folder, "reuters.ldac"), n_words=len(vocab)).with_vocab(vocab)


def load_corpus(spec: str) -> Corpus:
    """``"reuters"``, a ``*.ldac`` file (vocabulary from ``<file>.vocab`` if present), or a UCI
    docword file (anything else, ``.gz`` allowed). ``"synthetic"`` is handled by the LDA problem."""
    if spec == "reuters":
        return load_reuters()
    if not os.path.exists(spec):
        raise FileNotFoundError(f"corpus file {spec!r} does not exist")
    if spec.endswith((".ldac", ".ldac.gz")):
        vocab = spec + ".vocab"
        return load_ldac(spec, vocab if os.path.exists(vocab) else None)
    return load_docword(spec)
