"""PNG figures from run directories.

:func:`make_plots` draws one run's figures into ``<run>/plots/``:

- ``return_vs_steps.png``, ``return_vs_time.png``: training and evaluation return;
- ``syncs_per_worker.png``: weight syncs per worker, and all syncs over env steps;
- ``bytes_by_kind.png``: the run's bytes on the wire by kind;
- ``bytes_per_step.png``: bytes on the wire per env step, on average since the start and update by update,
  in all and by kind (the ``bytes/<kind>`` columns the metrics have; the rest is drawn as ``other``);
- ``kl_vs_delta.png`` (AAPS runs): the KL estimate of the workers' policies against the learner over env
  steps, the threshold δ, and every sync event; below it the policy lag and AAPS's ``max_policy_lag`` guard.

:func:`make_overlay` draws several runs (a δ sweep, seeds, sync rules) in one figure: return, bytes and
syncs over env steps, and the KL of AAPS runs against each run's δ; each run is labelled by the
``config.json`` keys whose values differ between the runs (or by its directory name).

Every figure is drawn from what the run's files hold (``metrics.jsonl``, ``summary.json``,
``config.json``): a figure whose data is missing is skipped, not an error. A run of more than 20,000 metrics rows
is drawn from every k-th row, every evaluation and the last row (:func:`~frugalrl.runs.read_metrics_thinned`):
"update by update" then means over k updates.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from frugalrl.runs import read_metrics_thinned  # noqa: E402

KL_MEAN = "syncs/kl_mean"
"""Mean over the workers of the last AAPS KL estimate (a metrics column of ClusterEnv runs)."""
KL_MAX = "syncs/kl_max"
"""Largest worker KL estimate: drawn when the metrics have it."""
KL_WORKER = "syncs/kl/"
"""Prefix of one worker's KL estimate (``syncs/kl/0``...): drawn when the metrics have it."""
SYNCS = "syncs/total"
"""Weight syncs sent so far, all workers together."""
BYTES = "bytes/"
"""Prefix of the cumulative byte counters: ``bytes/total`` and ``bytes/<kind>``."""

AAPS_NAMES = ("aaps", "kl", "adaptive", "adaptivekl")
"""``sync`` values that name AAPS (see :func:`frugalrl.sync.make_sync_rule`)."""
UNLABELLED = frozenset({"run_name", "run_dir", "_meta", "progress", "tensorboard", "log_every_s", "plots",
                        "torch_threads"})
"""Config keys that never label a run in an overlay (they do not change what a run does)."""


# ---------------------------------------------------------------------- reading a run
def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError):
        return {}
    return data if isinstance(data, dict) else {}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _sync_rule(summary: dict[str, Any] | None) -> str:
    """The rule a run's summary names (``aaps(0.05, lag<=20)``, ``every``), or ''."""
    return str(((summary or {}).get("details") or {}).get("sync_rule", ""))


def aaps_delta(config: dict[str, Any], summary: dict[str, Any] | None = None) -> float | None:
    """δ of a run whose sync rule is AAPS (None for other rules): from ``config.json``, else from the rule
    the summary names (``aaps(0.05, lag<=20)``)."""
    sync = config.get("sync")
    if isinstance(sync, str):
        if sync.lower() in AAPS_NAMES and _number(config.get("kl_threshold")):
            return float(config["kl_threshold"])
        return None
    rule = _sync_rule(summary)
    if rule.startswith("aaps("):
        try:
            return float(rule[5:].split(",")[0].rstrip(")"))
        except ValueError:
            return None
    return None


def aaps_lag_guard(config: dict[str, Any], summary: dict[str, Any] | None = None) -> int | None:
    """The lag guard an AAPS run applied: from the rule the summary names (``aaps(0.05, lag<=8)``; the guard
    can be a share of the run's updates), else ``max_policy_lag`` from ``config.json``."""
    rule = _sync_rule(summary)
    if rule.startswith("aaps(") and "lag<=" in rule:
        try:
            return int(rule.split("lag<=")[1].rstrip(")"))
        except ValueError:
            pass
    lag = config.get("max_policy_lag")
    return int(lag) if isinstance(lag, int) and not isinstance(lag, bool) else None


def _byte_kinds(rows: list[dict[str, Any]]) -> list[str]:
    """The ``bytes/<kind>`` columns (``total`` excluded) that count anything."""
    kinds: set[str] = set()
    for r in rows:
        kinds.update(k[len(BYTES):] for k, v in r.items() if k.startswith(BYTES) and _number(v) and v > 0)
    kinds.discard("total")
    return sorted(kinds)


def _sync_events(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """(row, workers synced) for every row whose ``syncs/total`` rose (the first row counts from zero)."""
    events = []
    before = 0
    for r in rows:
        if not _number(r.get(SYNCS)):
            continue
        now = int(r[SYNCS])
        if now > before:
            events.append((r, now - before))
        before = now
    return events


def _moving_mean(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


# ---------------------------------------------------------------------- one run
def make_plots(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw every plot the run's files allow into ``out_dir`` (default ``run_dir/plots``); return the paths
    written (none when the run has no data for them)."""
    run_dir = Path(run_dir)
    out = run_dir / "plots" if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_metrics_thinned(run_dir)
    summary = _read_json(run_dir / "summary.json")
    config = _read_json(run_dir / "config.json")
    written: list[Path] = []
    title = f"{summary.get('algo', config.get('algo', ''))} on {summary.get('env_id', config.get('env', ''))}"

    ret = [r for r in rows if _number(r.get("train/episode_return"))]
    evals = [r for r in rows if _number(r.get("eval/return_mean"))]
    for x_key, label, fname in (("step", "env steps", "return_vs_steps.png"), ("time", "wall seconds", "return_vs_time.png")):
        if not ret and not evals:
            break
        fig, ax = plt.subplots(figsize=(6, 4))
        if ret:
            ax.plot([r[x_key] for r in ret], [r["train/episode_return"] for r in ret], label="training episodes (mean)")
        if evals:
            ax.plot([r[x_key] for r in evals], [r["eval/return_mean"] for r in evals], "o-", label="evaluation")
        ax.set_xlabel(label)
        ax.set_ylabel("episode return")
        ax.set_title(title)
        ax.legend()
        ax.grid(alpha=0.3)
        written.append(_save(fig, out / fname))

    per_worker = (summary.get("weight_syncs") or {}).get("per_worker")
    sync_rows = [r for r in rows if _number(r.get(SYNCS))]
    if per_worker:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        axes[0].bar(range(len(per_worker)), per_worker)
        axes[0].set_xlabel("worker")
        axes[0].set_ylabel("weight syncs")
        axes[0].set_title("syncs per worker")
        if sync_rows:
            axes[1].plot([r["step"] for r in sync_rows], [r[SYNCS] for r in sync_rows])
            axes[1].set_xlabel("env steps")
            axes[1].set_ylabel("cumulative syncs (all workers)")
            axes[1].grid(alpha=0.3)
        written.append(_save(fig, out / "syncs_per_worker.png"))

    nbytes = summary.get("bytes") or {}
    kinds = {k: v for k, v in nbytes.items() if isinstance(v, int) and k not in ("total", "messages") and v > 0}
    if kinds:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar(list(kinds), [v / 1e6 for v in kinds.values()])
        ax.set_ylabel("MB")
        ax.set_title(f"bytes by kind (total {nbytes.get('total', 0) / 1e6:.2f} MB)")
        ax.tick_params(axis="x", rotation=30)
        written.append(_save(fig, out / "bytes_by_kind.png"))

    path = _bytes_per_step(rows, out / "bytes_per_step.png", title)
    if path is not None:
        written.append(path)
    delta = aaps_delta(config, summary)
    if delta is not None:
        path = _kl_vs_delta(rows, delta, aaps_lag_guard(config, summary), out / "kl_vs_delta.png", title)
        if path is not None:
            written.append(path)
    return written


def _bytes_per_step(rows: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Bytes per env step over env steps: since the start (cumulative bytes / steps) and in each update
    (new bytes / new steps), in all and by kind. None when the metrics count no bytes."""
    rows = [r for r in rows if _number(r.get(BYTES + "total")) and _number(r.get("step")) and r["step"] > 0]
    if not rows or not any(r[BYTES + "total"] > 0 for r in rows):
        return None
    kinds = _byte_kinds(rows)
    series: dict[str, list[float]] = {k: [float(r.get(BYTES + k) or 0) for r in rows] for k in kinds}
    total = [float(r[BYTES + "total"]) for r in rows]
    if kinds:
        other = [t - sum(series[k][i] for k in kinds) for i, t in enumerate(total)]
        if any(o > 0.005 * t for o, t in zip(other, total, strict=True)):
            series["other"] = [max(o, 0.0) for o in other]
    steps = [float(r["step"]) for r in rows]

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    lines = [("total", total)] + list(series.items())
    for name, values in lines:
        style = {"color": "black", "linewidth": 2} if name == "total" else {"linewidth": 1.2}
        axes[0].plot(steps, [v / s for v, s in zip(values, steps, strict=True)], label=name, **style)
        # update by update: the bytes each update added over the steps it took
        xs, rate = [], []
        for i in range(1, len(rows)):
            ds = steps[i] - steps[i - 1]
            if ds > 0:
                xs.append(steps[i])
                rate.append((values[i] - values[i - 1]) / ds)
        if xs:
            axes[1].plot(xs, rate, label=name, drawstyle="steps-pre", **style)
    axes[0].set_title(f"bytes per env step since the start ({total[-1] / steps[-1]:.1f} B/step at the end)")
    axes[1].set_title("bytes per env step, update by update")
    for ax in axes:
        ax.set_xlabel("env steps")
        ax.set_ylabel("bytes / env step")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title}: {total[-1] / 1e6:.2f} MB in {int(steps[-1])} env steps")
    return _save(fig, path)


def _kl_vs_delta(rows: list[dict[str, Any]], delta: float, max_lag: Any, path: Path, title: str) -> Path | None:
    """An AAPS run's KL estimate against δ with its sync events; the policy lag against the guard below.

    A row's KL is the one the sync rule measured before the rollout that row's update learnt from (each worker's
    last estimate), and the syncs of that row are the ones it decided then. None when no KL was logged."""
    kl_rows = [r for r in rows if _number(r.get(KL_MEAN))]
    if not kl_rows:
        return None
    lag_rows = [r for r in rows if _number(r.get("charts/policy_lag"))]
    if lag_rows:
        fig, (ax, lag_ax) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 1])
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        lag_ax = None

    def positive(key: str) -> tuple[list[float], list[float]]:
        pts = [(r["step"], r[key]) for r in rows if _number(r.get(key)) and r[key] > 0]
        return [p[0] for p in pts], [p[1] for p in pts]

    workers = sorted({k for r in rows for k in r if k.startswith(KL_WORKER) and k[len(KL_WORKER):].isdigit()},
                     key=lambda k: int(k[len(KL_WORKER):]))
    for i, key in enumerate(workers):
        xs, ys = positive(key)
        ax.plot(xs, ys, linewidth=0.7, alpha=0.5, color=f"C{2 + i % 8}", label=f"worker {key[len(KL_WORKER):]}")
    xs, ys = positive(KL_MEAN)
    ax.plot(xs, ys, color="C0", linewidth=1.5, label="KL, mean over workers")
    if any(_number(r.get(KL_MAX)) for r in rows):
        xs, ys = positive(KL_MAX)
        ax.plot(xs, ys, color="C1", linewidth=1.0, label="KL, largest worker")
    ax.axhline(delta, color="red", linestyle="--", linewidth=1.2, label=f"δ = {delta:g}")

    # Sync events: a tick at the bottom for each, a marker on the KL curve (filled where the KL is over δ).
    events = _sync_events(rows)
    kl_key = KL_MAX if any(_number(r.get(KL_MAX)) for r in rows) else KL_MEAN
    ax.vlines([r["step"] for r, _ in events], 0, [min(0.04 * n, 0.2) for _, n in events],
              transform=ax.get_xaxis_transform(), color="black", linewidth=0.8,
              label=f"sync events, tick height: workers synced ({sum(n for _, n in events)} syncs)")
    over = [(r["step"], r[kl_key]) for r, _ in events if _number(r.get(kl_key)) and r[kl_key] > delta]
    under = [(r["step"], r[kl_key]) for r, _ in events if _number(r.get(kl_key)) and 0 < r[kl_key] <= delta]
    which = "largest" if kl_key == KL_MAX else "mean"
    if over:
        ax.plot(*zip(*over, strict=True), "o", color="red", markersize=5, label=f"sync, KL ({which}) > δ")
    if under:
        ax.plot(*zip(*under, strict=True), "o", mfc="none", color="black", markersize=5,
                label=f"sync, KL ({which}) ≤ δ" + (" (guard, or one worker over δ)" if which == "mean" else " (guard)"))
    ax.set_yscale("log")
    ax.set_ylabel("KL(worker policy ‖ learner)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.01), ncols=2, frameon=False)
    fig.suptitle(f"{title}: AAPS KL vs δ")
    if lag_ax is not None:
        lag_ax.plot([r["step"] for r in lag_rows], [r["charts/policy_lag"] for r in lag_rows], color="C4",
                    linewidth=1, label="policy lag (mean)")
        if _number(max_lag):
            lag_ax.axhline(float(max_lag), color="red", linestyle=":", linewidth=1, label=f"max_policy_lag = {max_lag}")
        lag_ax.set_ylabel("updates")
        lag_ax.set_ylim(bottom=0)
        lag_ax.grid(alpha=0.3)
        lag_ax.legend(fontsize=7, loc="upper left")
    (lag_ax or ax).set_xlabel("env steps")
    return _save(fig, path)


# ---------------------------------------------------------------------- several runs
def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ",".join(_format(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def differing_keys(configs: Sequence[dict[str, Any]]) -> list[str]:
    """The config keys whose values are not the same in every config (a key one lacks counts as differing),
    save those that never change what a run does (:data:`UNLABELLED`); in the order of the first config."""
    order: list[str] = []
    for c in configs:
        order += [k for k in c if k not in order and k not in UNLABELLED]
    missing = object()
    return [k for k in order
            if len({json.dumps(c.get(k, missing), sort_keys=True, default=str) for c in configs}) > 1]


def run_labels(run_dirs: Sequence[str | Path], max_keys: int = 3) -> list[str]:
    """One label per run: the differing ``config.json`` keys (``kl_threshold=0.05``; at most ``max_keys``
    of them), else the directory name (the path where two runs share a name)."""
    dirs = [Path(d) for d in run_dirs]
    return _labels(dirs, [_read_json(d / "config.json") for d in dirs], max_keys)


def _labels(dirs: Sequence[Path], configs: Sequence[dict[str, Any]], max_keys: int = 3) -> list[str]:
    keys = differing_keys(configs) if all(configs) else []
    if 0 < len(keys) <= max_keys:
        labels = [", ".join(f"{k}={_format(c.get(k))}" for k in keys) for c in configs]
        if len(set(labels)) == len(labels):
            return labels
    names = [d.resolve().name for d in dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in dirs]


def make_overlay(run_dirs: Sequence[str | Path], out_path: str | Path,
                 labels: Sequence[str] | None = None) -> Path:
    """Draw several runs in one figure at ``out_path``: return (training, averaged over 10 updates, and
    evaluations), cumulative bytes and weight syncs over env steps, and, where AAPS runs logged it, the KL
    estimate against each run's δ. ``labels`` default to :func:`run_labels`. Panels no run has data for are
    left out; ``ValueError`` if no run has metrics at all."""
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("make_overlay needs at least one run directory")
    configs = [_read_json(d / "config.json") for d in dirs]  # read once: labels, δ and the title use them
    if labels is None:
        labels = _labels(dirs, configs)
    elif len(labels) != len(dirs):
        raise ValueError(f"{len(labels)} labels for {len(dirs)} runs")
    runs: list[tuple[list[dict[str, Any]], float | None]] = []  # (metrics rows, δ of an AAPS run)
    for d, config in zip(dirs, configs, strict=True):
        runs.append((read_metrics_thinned(d), aaps_delta(config, _read_json(d / "summary.json"))))
    if not any(rows for rows, _ in runs):
        raise ValueError("none of the runs has metrics (metrics.jsonl): " + ", ".join(str(d) for d in dirs))

    def has(key: str) -> bool:
        return any(_number(row.get(key)) for rows, _ in runs for row in rows)

    panels = [p for p, present in (("return", has("train/episode_return") or has("eval/return_mean")),
                                   ("bytes", has(BYTES + "total")), ("syncs", has(SYNCS)),
                                   ("kl", has(KL_MEAN))) if present]
    if not panels:
        panels = ["return"]
    ncols = 2 if len(panels) == 4 else len(panels)
    nrows = 2 if len(panels) == 4 else 1
    fig, grid = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4 * nrows), squeeze=False)
    axes = dict(zip(panels, grid.flat, strict=True))
    for i, ((rows, delta), label) in enumerate(zip(runs, labels, strict=True)):
        color = f"C{i % 10}"
        if "return" in axes:
            ax = axes["return"]
            ret = [r for r in rows if _number(r.get("train/episode_return"))]
            if ret:
                ax.plot([r["step"] for r in ret], _moving_mean([r["train/episode_return"] for r in ret], 10),
                        color=color, label=label)
            ev = [r for r in rows if _number(r.get("eval/return_mean"))]
            if ev:
                ax.plot([r["step"] for r in ev], [r["eval/return_mean"] for r in ev], "o", color=color, markersize=4,
                        label=None if ret else label)
        if "bytes" in axes:
            b = [r for r in rows if _number(r.get(BYTES + "total"))]
            if b:
                axes["bytes"].plot([r["step"] for r in b], [r[BYTES + "total"] / 1e6 for r in b], color=color,
                                   label=f"{label} ({b[-1][BYTES + 'total'] / 1e6:.2f} MB)")
        if "syncs" in axes:
            s = [r for r in rows if _number(r.get(SYNCS))]
            if s:
                axes["syncs"].plot([r["step"] for r in s], [r[SYNCS] for r in s], color=color,
                                   label=f"{label} ({int(s[-1][SYNCS])})")
        if "kl" in axes:
            k = [r for r in rows if _number(r.get(KL_MEAN)) and r[KL_MEAN] > 0]
            if k:
                axes["kl"].plot([r["step"] for r in k], [r[KL_MEAN] for r in k], color=color, linewidth=1,
                                label=label)
            if delta is not None:
                axes["kl"].axhline(delta, color=color, linestyle="--", linewidth=1)
    titles = {"return": ("episode return", "return (training: mean of 10 updates; dots: evaluation)"),
              "bytes": ("MB on the wire (cumulative)", "bytes on the wire"),
              "syncs": ("weight syncs (all workers)", "weight syncs"),
              "kl": ("KL(worker ‖ learner), mean", "AAPS KL estimate (dashed: each run's δ)")}
    for name, ax in axes.items():
        ylabel, title = titles[name]
        ax.set_xlabel("env steps")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        if name == "kl":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(_overlay_title(len(dirs), configs))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, out)


def _overlay_title(n: int, configs: Sequence[dict[str, Any]]) -> str:
    """``ppo on CartPole-v1: 3 runs, by kl_threshold`` (what the runs share and what tells them apart)."""
    shared = []
    for key in ("algo", "env"):
        values = {str(c.get(key)) for c in configs}
        if len(values) == 1 and None not in (c.get(key) for c in configs):
            shared.append(values.pop())
    head = " on ".join(shared) if shared else "runs"
    keys = differing_keys(configs) if all(configs) else []
    more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
    return f"{head}: {n} runs" + (f", by {', '.join(keys[:3])}{more}" if keys else "")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
