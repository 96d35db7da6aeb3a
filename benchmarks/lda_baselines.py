"""DPSVI against gensim and scikit-learn: time to a target held-out perplexity, one run, same split.

    pip install -e ".[lda-bench]"                        # gensim, scikit-learn, lda (Reuters)
    python benchmarks/lda_baselines.py                   # reuters + synthetic, every method (~1.5 min, 2 cores)
    python benchmarks/lda_baselines.py --quick           # smoke run (seconds)
    python benchmarks/lda_baselines.py --corpus reuters --dpsvi 1x1 2x1 1x2 --gensim-workers 1 2 --target 2100
    python benchmarks/lda_baselines.py --corpus synthetic-large --seed 0 --out lda_baselines_large_seed0
                                                         # 100,000 docs, Zipf-like V = 50,000 (~3.5 min)

MB pushed and the push ratio: DPSVI's pushed bytes as counted on the wire, against what its pushes would take
dense in fp32 (``pushes × K × V × 4`` bytes).

Methods, on the same corpus, the same K and the same priors (``alpha = eta = 1/K`` unless given):

- ``dpsvi-wWpP``: our DPSVI (:func:`frugalrl.dpsgd.lda.fit_lda`) with ``W`` workers of ``P`` Hogwild
  processes (``--dpsvi WxP ...``), with ``LDAConfig``'s defaults: batch 2000 (``--dpsvi-batch``; all the
  documents when fewer), ``rho=1``, local rate ``(1 + t)^(-1/2)`` over global updates ``t``, column-sparse
  pushes (decaying the server's current λ with several workers, ``column_base``), λ started from random
  topics each nudged towards one of ``K`` mutually dissimilar training documents (``init="seeded"``; gensim
  and scikit-learn start from random topics), the numba E-step where numba is installed;
- ``gensim-wW``: ``gensim.models.LdaMulticore`` with ``W`` worker processes (``--gensim-workers``),
  one ``update()`` call of ``--passes`` passes over the training documents, gensim's default schedule
  (``decay=0.5``, ``offset=1``), ``chunksize=2000`` (gensim's default; Reuters: 128, see ``PRESETS``),
  ``iterations=100``, ``gamma_threshold=1e-3``, its float32 state;
- ``sklearn-online``: ``LatentDirichletAllocation(learning_method="online", n_jobs=1)`` fed by
  ``partial_fit`` in mini-batches of 64 documents with ``total_samples`` set, ``--passes`` passes in
  corpus order (what ``fit`` does), sklearn's default schedule (``learning_decay=0.7``, ``offset=10``).

Fairness. :class:`~frugalrl.dpsgd.lda.LDAProblem` makes the split once: the training documents
(``.train``, the only ones any method sees) and the held-out documents with their observed / held-out
word halves. Every method's perplexity is our :func:`~frugalrl.dpsgd.lda.completion_perplexity` of
its topic-word Dirichlet parameter λ on that split (gensim: ``state.get_lambda()`` = ``eta + sstats``;
sklearn: ``components_``; DPSVI: its λ clamped at ``eta``, as ``LDAProblem.perplexity`` does; ``fit_lda``
builds its problem from the same ``LDAConfig`` fields, hence the same split, and its final perplexity is
checked against ours, ``final_perplexity_check`` in the results). Every
method processes the same number of documents (``--passes`` × the training set; DPSVI:
``ceil(passes · D / (min(batch, D) · P))`` global updates). BLAS runs one thread per process
(``OMP/OPENBLAS/MKL_NUM_THREADS=1`` unless set), so ``w1`` means one core of work.

Clocks. Training time excludes every evaluation: the baselines keep a copy of λ at about ``--evals``
points of the run (gensim: after an M-step, from a hook on ``do_mstep``, the copy counted; sklearn:
between ``partial_fit`` calls, not counted) and evaluate them after training. DPSVI's seconds are the
parameter server's (worker startup excluded, shown apart); by default its perplexities are also
computed after the run (``LDAConfig.deferred_eval``, where the installed frugalrl has it), so they take
no CPU from the workers and the run does not stop at the target; ``--dpsvi-eval live`` evaluates during
the run and stops at the target. Time to target is the training time of the first evaluated point at or
below the target (so its resolution is one evaluation interval).

Target. ``--target X``, or by default ``(1 + --target-slack) ×`` the final perplexity of the first
method run (``gensim-w1`` when it is in the list; gensim runs first), computed in the same run; the
rule is written into the results. Results: ``benchmarks/results/<out>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy: one BLAS thread per process (DPSVI workers inherit it)

import numpy as np  # noqa: E402

from frugalrl.dpsgd.lda import LDAConfig, LDAProblem, completion_perplexity, fit_lda  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PRESETS: dict[str, dict[str, Any]] = {
    # corpus: LDAConfig fields, --passes and --gensim-chunksize of the full run. Reuters has 355 training
    # docs: gensim's default chunk of 2000 would be the whole corpus, leaving a second worker idle.
    "reuters": {"cfg": {"corpus": "reuters", "n_topics": 20}, "passes": 30, "chunksize": 128},
    "synthetic": {
        "cfg": {
            "corpus": "synthetic",
            "n_topics": 20,
            "synthetic_docs": 20_000,
            "synthetic_vocab": 2_000,
            "synthetic_doc_len": 100,
        },
        "passes": 3,
        "chunksize": 2000,
    },
    # 100,000 documents over a Zipf-like vocabulary of 50,000 words (LDAConfig.synthetic_zipf): a batch of
    # 2000 documents touches about 30% of the words, so column pushes pay. Generated at run time (~3 s).
    "synthetic-large": {
        "cfg": {
            "corpus": "synthetic",
            "n_topics": 20,
            "synthetic_docs": 100_000,
            "synthetic_vocab": 50_000,
            "synthetic_doc_len": 100,
            "synthetic_zipf": 1.2,
        },
        "passes": 2,
        "chunksize": 2000,
    },
}
QUICK: dict[str, dict[str, Any]] = {
    "reuters": {"cfg": {"corpus": "reuters", "n_topics": 5}, "passes": 2, "chunksize": 128},
    "synthetic": {
        "cfg": {
            "corpus": "synthetic",
            "n_topics": 5,
            "synthetic_docs": 600,
            "synthetic_vocab": 300,
            "synthetic_doc_len": 50,
        },
        "passes": 2,
        "chunksize": 128,
    },
    "synthetic-large": {
        "cfg": {
            "corpus": "synthetic",
            "n_topics": 5,
            "synthetic_docs": 1500,
            "synthetic_vocab": 5000,
            "synthetic_doc_len": 50,
            "synthetic_zipf": 1.2,
        },
        "passes": 2,
        "chunksize": 128,
    },
}


def need_baselines(gensim: bool, sklearn: bool) -> None:
    """Exit with an install hint when a baseline library that the run needs is missing."""
    missing = []
    for module, dist, needed in (("gensim", "gensim", gensim), ("sklearn", "scikit-learn", sklearn)):
        try:
            if needed:
                __import__(module)
        except ImportError:
            missing.append(dist)
    if missing:
        sys.exit(f'lda_baselines: {", ".join(missing)} not installed; run  pip install -e ".[lda-bench]"')


def lib_version(dist: str) -> str | None:
    """Installed version of ``dist`` (None if absent)."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def first_at(curve: list[list[float]], target: float | None) -> tuple[float | None, int | None]:
    """``(training seconds, documents)`` of the first curve point ``(seconds, docs, perplexity)`` at or
    below ``target``; ``(None, None)`` if none."""
    if target is None:
        return None, None
    return next(((float(t), int(d)) for t, d, p in curve if p <= target), (None, None))


class Split:
    """The one train / held-out split every method uses (from :class:`LDAProblem`)."""

    def __init__(self, cfg: LDAConfig) -> None:
        t0 = time.perf_counter()
        self.problem = LDAProblem(**cfg.problem_kwargs())
        self.seconds = time.perf_counter() - t0
        p = self.problem
        self.k, self.v = p.shape
        self.alpha, self.eta = p.alpha, p.topic_prior  # eta: gensim's name of the topic prior
        self.train = p.train

    def perplexity(self, lam: np.ndarray) -> float:
        """Our document-completion perplexity of the topic-word parameter ``lam`` on the held-out split."""
        p = self.problem
        return completion_perplexity(
            np.asarray(lam, dtype=np.float64), p.observed, p.heldout, p.alpha, p.e_step_iters, p.e_step_tol
        )

    def stats(self) -> dict[str, Any]:
        """Sizes of the corpus and the split."""
        p = self.problem
        return {
            "train_docs": p.train.n_docs,
            "train_tokens": p.train.n_tokens,
            "heldout_docs": p.heldout.n_docs,
            "heldout_tokens": p.heldout.n_tokens + p.observed.n_tokens,
            "vocab": p.n_words,
            "build_seconds": round(self.seconds, 2),
        }


def evaluate(split: Split, snaps: list[tuple[float, int, np.ndarray]]) -> tuple[list[list[float]], float]:
    """``[(seconds, docs, perplexity)]`` of the snapshots ``(seconds, docs, λ)``; and the seconds spent."""
    t0 = time.perf_counter()
    curve = [[round(t, 4), int(d), split.perplexity(lam)] for t, d, lam in snaps]
    return curve, time.perf_counter() - t0


# --------------------------------------------------------------------------------------- baselines
def run_gensim(
    split: Split, workers: int, passes: int, chunksize: int, evals: int, seed: int
) -> dict[str, Any]:
    """``LdaMulticore`` with ``workers`` processes: one ``update()`` of ``passes`` passes, λ kept after
    about ``evals`` M-steps (and at the end), evaluated afterwards."""
    from gensim.models import LdaMulticore  # noqa: PLC0415 - optional dependency

    train = split.train
    bow = [list(zip(*(a.tolist() for a in train.doc(d)), strict=True)) for d in range(train.n_docs)]
    model = LdaMulticore(
        corpus=None,
        num_topics=split.k,
        id2word={i: str(i) for i in range(split.v)},
        workers=workers,
        chunksize=chunksize,
        passes=passes,
        alpha=split.alpha,
        eta=split.eta,
        eval_every=0,
        iterations=100,
        gamma_threshold=1e-3,
        random_state=seed,
    )
    msteps = passes * math.ceil(train.n_docs / (chunksize * workers))
    every = max(1, math.ceil(msteps / evals))
    snaps: list[tuple[float, int, np.ndarray]] = [(0.0, 0, model.state.get_lambda().copy())]
    count = {"msteps": 0, "docs": 0}
    original = model.do_mstep
    t0 = 0.0

    def do_mstep(rho: float, other: Any, extra_pass: bool = False) -> None:
        count["docs"] += int(other.numdocs)
        original(rho, other, extra_pass)
        count["msteps"] += 1
        if count["msteps"] % every == 0:
            snaps.append((time.perf_counter() - t0, count["docs"], model.state.get_lambda()))  # a new array

    model.do_mstep = do_mstep  # the update loop calls self.do_mstep in this (the main) process
    t0 = time.perf_counter()
    model.update(bow)
    seconds = time.perf_counter() - t0
    if snaps[-1][1] != count["docs"]:
        snaps.append((seconds, count["docs"], model.state.get_lambda().copy()))
    curve, eval_s = evaluate(split, snaps)
    return {
        "train_seconds": seconds,
        "curve": curve,
        "eval_seconds": eval_s,
        "docs": count["docs"],
        "settings": {
            "workers": workers,
            "passes": passes,
            "chunksize": chunksize,
            "m_steps": count["msteps"],
            "decay": model.decay,
            "offset": model.offset,
            "iterations": 100,
            "gamma_threshold": 1e-3,
            "dtype": "float32",
        },
    }


def run_sklearn(split: Split, passes: int, batch: int, evals: int, seed: int) -> dict[str, Any]:
    """Online ``LatentDirichletAllocation`` by ``partial_fit``: ``passes`` passes of ``batch``-document
    mini-batches in corpus order, λ (``components_``) kept between calls, evaluated afterwards."""
    from sklearn.decomposition import LatentDirichletAllocation  # noqa: PLC0415 - optional dependency

    x = split.train.to_scipy()
    n = x.shape[0]
    model = LatentDirichletAllocation(
        n_components=split.k,
        doc_topic_prior=split.alpha,
        topic_word_prior=split.eta,
        learning_method="online",
        batch_size=batch,
        total_samples=n,
        n_jobs=1,
        random_state=seed,
    )
    batches_per_pass = math.ceil(n / batch)
    total = passes * batches_per_pass
    every = max(1, math.ceil(total / evals))
    snaps: list[tuple[float, int, np.ndarray]] = []
    seconds, done, docs = 0.0, 0, 0
    while done < total:
        # one partial_fit call runs `every` mini-batches (it splits its input by batch_size), within a pass
        b = done % batches_per_pass
        stop = min(b + every, batches_per_pass, b + total - done)
        rows = x[b * batch : min(stop * batch, n)]
        t0 = time.perf_counter()
        model.partial_fit(rows)
        seconds += time.perf_counter() - t0
        done += stop - b
        docs += rows.shape[0]
        snaps.append((seconds, docs, model.components_.copy()))
    curve, eval_s = evaluate(split, snaps)
    return {
        "train_seconds": seconds,
        "curve": curve,
        "eval_seconds": eval_s,
        "docs": docs,
        "settings": {
            "passes": passes,
            "batch_size": batch,
            "partial_fit_calls": len(snaps),
            "learning_decay": model.learning_decay,
            "learning_offset": model.learning_offset,
            "max_doc_update_iter": model.max_doc_update_iter,
            "mean_change_tol": model.mean_change_tol,
            "n_jobs": 1,
        },
    }


# --------------------------------------------------------------------------------------- DPSVI
def run_dpsvi(
    base: LDAConfig,
    split: Split,
    workers: int,
    processes: int,
    passes: int,
    evals: int,
    target: float | None,
    eval_mode: str,
    time_limit: float | None,
) -> dict[str, Any]:
    """``fit_lda`` with ``workers`` × ``processes`` and the documents of ``passes`` passes."""
    docs_per_update = min(base.batch_size, split.train.n_docs) * processes * base.local_steps * base.master_batch
    updates = max(1, math.ceil(passes * split.train.n_docs / docs_per_update))
    fields = {f.name for f in dataclasses.fields(LDAConfig)}
    extra: dict[str, Any] = {}
    if "deferred_eval" in fields:
        extra["deferred_eval"] = eval_mode == "deferred"
    cfg = dataclasses.replace(
        base,
        workers=workers,
        processes=processes,
        global_updates=updates,
        log_every=max(1, math.ceil(updates / evals)),
        target_perplexity=target,
        time_limit_s=time_limit,
        **extra,
    )
    t0 = time.perf_counter()
    out = fit_lda(cfg)
    total = time.perf_counter() - t0
    curve = [[round(t, 4), int(u) * docs_per_update, float(p)] for t, u, p in out["perplexity_curve"]]
    # what the same pushes would have cost dense in fp32 (K x V float32 values each, no header)
    dense_push_bytes = int(out["pushes"]) * split.k * split.v * 4
    pushed = int(out["bytes"]["gradients"])
    lam = np.maximum(np.asarray(out["lambda"], dtype=np.float64), split.eta)
    check = split.perplexity(lam)  # the same function on the same split: equals out["final_perplexity"]
    return {
        "train_seconds": out["wall_time_s"],
        "curve": curve,
        "startup_seconds": out["startup_s"],
        "eval_seconds": None,
        "docs": out["global_updates"] * docs_per_update,
        "bytes": out["bytes"],
        "pushes": out["pushes"],
        "dense_fp32_push_bytes": dense_push_bytes,
        "push_ratio_vs_dense_fp32": (dense_push_bytes / pushed) if pushed else None,
        "stop_reason": out["stop_reason"],
        "fit_lda_time_to_target_s": out.get("time_to_target_s"),
        "final_perplexity_check": check,
        "call_seconds": total,
        "settings": {
            "workers": workers,
            "processes": processes,
            "global_updates": out["global_updates"],
            "planned_updates": updates,
            "batch_size": min(base.batch_size, split.train.n_docs),
            "eta_decay": base.eta_decay,
            "eta_offset": base.eta_offset,
            "update_format": base.update_format,
            "update_codec": base.update_codec,
            "column_base": cfg.resolved_column_base(),
            "e_step_backend": base.e_step_backend,
            "rho": out["rho"],
            "eta": out["eta"],
            "log_every": cfg.log_every,
            "eval": (eval_mode if "deferred_eval" in fields else "live (no deferred_eval field)"),
            "updates_per_second": out["updates_per_second"],
            "staleness_mean": out["staleness"].get("mean"),
        },
    }


# --------------------------------------------------------------------------------------- the run
def parse_pair(text: str) -> tuple[int, int]:
    """``"2x1"`` → ``(2, 1)`` (workers × Hogwild processes)."""
    try:
        w, p = (int(s) for s in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected WORKERSxPROCESSES like 2x1, got {text!r}") from e
    if w < 1 or p < 1:
        raise argparse.ArgumentTypeError(f"workers and processes must be >= 1, got {text!r}")
    return w, p


def run_corpus(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every method on corpus ``name``; rows and the target."""
    preset = (QUICK if args.quick else PRESETS)[name]
    fields: dict[str, Any] = dict(preset["cfg"])
    if args.topics is not None:
        fields["n_topics"] = args.topics
    fields.update(alpha=args.alpha, topic_prior=args.eta, seed=args.seed)
    if args.dpsvi_batch is not None:
        fields["batch_size"] = args.dpsvi_batch
    fields.update(json.loads(args.dpsvi_extra))
    base = LDAConfig(**fields)
    passes = args.passes if args.passes is not None else preset["passes"]
    split = Split(base)
    chunksize = args.gensim_chunksize or preset["chunksize"]
    print(
        f"\n== {name}: {split.stats()}, K={split.k}, alpha={split.alpha:.4g}, eta={split.eta:.4g}, "
        f"passes={passes}",
        flush=True,
    )

    plan: list[tuple[str, Any]] = [(f"gensim-w{w}", ("gensim", w)) for w in args.gensim_workers]
    if not args.no_sklearn:
        plan.append(("sklearn-online", ("sklearn", None)))
    plan += [(f"dpsvi-w{w}p{p}", ("dpsvi", (w, p))) for w, p in args.dpsvi]
    target, rule = args.target, "given (--target)"
    rows = []
    for label, (kind, arg) in plan:
        print(f"[{time.strftime('%H:%M:%S')}] {name} / {label} ...", flush=True)
        t0 = time.perf_counter()
        if kind == "gensim":
            r = run_gensim(split, arg, passes, chunksize, args.evals, args.seed)
        elif kind == "sklearn":
            r = run_sklearn(split, passes, args.batch, args.evals, args.seed)
        else:
            r = run_dpsvi(
                base, split, arg[0], arg[1], passes, args.evals, target, args.dpsvi_eval, args.time_limit
            )
        perps = [p for _, _, p in r["curve"]]
        r.update(
            method=label,
            final_perplexity=perps[-1],
            best_perplexity=min(perps),
            wall_seconds=time.perf_counter() - t0,
        )
        if target is None:
            target = (1.0 + args.target_slack) * r["final_perplexity"]
            rule = (
                f"(1 + {args.target_slack}) x final perplexity of {label} after {passes} passes "
                f"(= {r['final_perplexity']:.2f}), computed first in this run"
            )
        rows.append(r)
        print(
            f"    final {r['final_perplexity']:.2f}, best {r['best_perplexity']:.2f}, "
            f"train {r['train_seconds']:.1f} s, {len(r['curve'])} evaluations",
            flush=True,
        )
    for r in rows:
        r["time_to_target_s"], r["docs_to_target"] = first_at(r["curve"], target)
    return {
        "corpus": name,
        "config": dataclasses.asdict(base),
        "split": split.stats(),
        "K": split.k,
        "alpha": split.alpha,
        "eta": split.eta,
        "passes": passes,
        "gensim_chunksize": chunksize,
        "target": target,
        "target_rule": rule,
        "methods": rows,
    }


def fmt(x: float | None, spec: str = ".2f") -> str:
    """``x`` formatted, or ``-``."""
    return "-" if x is None else format(x, spec)


def table(res: dict[str, Any]) -> str:
    """The markdown table of one corpus."""
    lines = [
        f"**{res['corpus']}**: {res['split']['train_docs']} training docs, {res['split']['heldout_docs']} "
        f"held-out docs, V={res['split']['vocab']}, K={res['K']}, alpha=eta={res['alpha']:.4g}, "
        f"{res['passes']} passes; target perplexity {fmt(res['target'])} ({res['target_rule']})",
        "",
        "| method | time to target (s) | docs to target | final perplexity | best perplexity "
        "| train time (s) | startup (s) | docs | evals | MB on the wire | MB pushed | push ratio vs dense fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["methods"]:
        mb = r["bytes"]["total"] / 1e6 if "bytes" in r else None
        pushed = r["bytes"]["gradients"] / 1e6 if "bytes" in r else None
        lines.append(
            f"| {r['method']} | {fmt(r['time_to_target_s'])} | {fmt(r['docs_to_target'], 'd')} | "
            f"{r['final_perplexity']:.2f} | {r['best_perplexity']:.2f} | {r['train_seconds']:.2f} | "
            f"{fmt(r.get('startup_seconds'))} | "
            f"{r['docs']} | {len(r['curve'])} | {fmt(mb, '.1f')} | {fmt(pushed, '.1f')} | "
            f"{fmt(r.get('push_ratio_vs_dense_fp32'))} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run the comparison, print the tables, write the results."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", nargs="+", choices=sorted(PRESETS), default=["reuters", "synthetic"])
    p.add_argument(
        "--dpsvi",
        nargs="*",
        type=parse_pair,
        default=[(1, 1), (2, 1)],
        metavar="WxP",
        help="DPSVI workers x Hogwild processes, one run each (default: 1x1 2x1)",
    )
    p.add_argument("--gensim-workers", nargs="*", type=int, default=[1, 2])
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--topics", type=int, default=None, help="K (default: 20; --quick: 5)")
    p.add_argument("--alpha", type=float, default=None, help="document-topic prior (default 1/K)")
    p.add_argument("--eta", type=float, default=None, help="topic-word prior (default 1/K)")
    p.add_argument(
        "--passes",
        type=int,
        default=None,
        help="passes over the training docs for every method (default: reuters 30, synthetic 3, synthetic-large 2)",
    )
    p.add_argument("--batch", type=int, default=64, help="sklearn mini-batch (documents)")
    p.add_argument(
        "--dpsvi-batch", type=int, default=None, help="DPSVI batch (documents; default: LDAConfig's, 2000)"
    )
    p.add_argument(
        "--gensim-chunksize",
        type=int,
        default=None,
        help="gensim chunksize (default: reuters 128, synthetic 2000 = gensim's default)",
    )
    p.add_argument("--evals", type=int, default=30, help="about this many evaluations per method")
    p.add_argument(
        "--target", type=float, default=None, help="target perplexity (default: see --target-slack)"
    )
    p.add_argument(
        "--target-slack",
        type=float,
        default=0.02,
        help="default target = (1 + slack) x the first method's final perplexity",
    )
    p.add_argument("--dpsvi-eval", choices=["deferred", "live"], default="deferred")
    p.add_argument(
        "--dpsvi-extra",
        default="{}",
        help="JSON of further LDAConfig fields: rates for DPSVI; corpus / split fields for every method",
    )
    p.add_argument("--time-limit", type=float, default=None, help="cap on each DPSVI run's seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny corpora and 2 passes: a smoke run")
    p.add_argument(
        "--out", default=None, help="results name (default lda_baselines; --quick: lda_baselines_quick)"
    )
    args = p.parse_args()
    need_baselines(gensim=bool(args.gensim_workers), sklearn=not args.no_sklearn)
    logging.getLogger("gensim").setLevel(logging.ERROR)
    out_name = args.out or ("lda_baselines_quick" if args.quick else "lda_baselines")

    t0 = time.perf_counter()
    corpora = [run_corpus(name, args) for name in args.corpus]
    tables = [table(res) for res in corpora]
    print()
    print("\n\n".join(tables))
    out = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "blas_threads": {
            v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        },
        "versions": {
            "python": platform.python_version(),
            **{d: lib_version(d) for d in ("frugalrl", "numpy", "scipy", "gensim", "scikit-learn")},
        },
        "total_seconds": time.perf_counter() - t0,
        "corpora": corpora,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{out_name}.json").write_text(json.dumps(out, indent=1))
    header = (
        f"# LDA baselines: time to target perplexity\n\n`{out['command']}` on {out['date']}, "
        f"{out['cpu_count']} CPUs, " + ", ".join(f"{k} {v}" for k, v in out["versions"].items()) + "\n\n"
    )
    notes = (
        "\n\nTimes exclude evaluation; DPSVI's exclude worker startup (column startup). Every perplexity is "
        "frugalrl's completion_perplexity on the same held-out split. See the script's docstring.\n"
    )
    (RESULTS / f"{out_name}.md").write_text(header + "\n\n".join(tables) + notes)
    print(f"\n{out['total_seconds']:.0f} s; results in {RESULTS / out_name}.json and .md")


if __name__ == "__main__":
    main()
