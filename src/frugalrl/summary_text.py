"""The summary of a finished run as ``frugalrl train`` prints it (from its ``summary.json`` fields)."""

from __future__ import annotations

from typing import Any


def per_worker(counts: list[int], total: int) -> str:
    """Syncs per worker as the summary line shows them: the list for a few workers, the spread for many (since
    the resume on another number of workers, if the counts fall short of the ``total``)."""
    if not counts:
        return ""
    since = "" if sum(counts) == total else f" since the resume on {len(counts)} worker{'s' * (len(counts) > 1)}"
    if len(set(counts)) == 1:
        return f" ({counts[0]} per worker{since})"
    if len(counts) <= 8:
        return f" (per worker{since} {counts})"
    ordered = sorted(counts)
    return f" (per worker{since} {ordered[0]} to {ordered[-1]}, median {ordered[len(ordered) // 2]})"


def evaluation_line(summary: dict[str, Any], how: str) -> str:
    """The summary's evaluation; a run stopped before its final evaluation (a signal) names its last one instead."""
    if not summary["eval_episodes"]:
        history = summary.get("eval_history") or []
        last = f": the last one {history[-1]['mean']:.1f} at step {history[-1]['step']}" if history else ""
        return f"  not evaluated at the end{last}"
    return (f"  evaluation return {summary['eval_return_mean']:.1f} ± {summary['eval_return_std']:.1f} "
            f"({summary['eval_episodes']} {how} episode{'' if summary['eval_episodes'] == 1 else 's'})"
            + ("" if summary.get("stochastic_return_mean") is None else
               f"; sampling actions {summary['stochastic_return_mean']:.1f} ± {summary['stochastic_return_std']:.1f}"))


def summary_text(summary: dict[str, Any]) -> str:
    """What ``frugalrl train`` prints at the end of a run: its steps and time, evaluation, syncs, bytes, warnings."""
    nbytes = {k: v for k, v in summary.get("bytes", {}).items()
              if k not in ("total", "messages") and isinstance(v, int | float) and v}  # kinds only
    top = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sorted(nbytes.items(), key=lambda kv: -kv[1])[:3])
    how = "deterministic" if summary.get("eval_deterministic", True) else "stochastic"
    lines = [
        f"\n{summary['algo']} on {summary['env_id']} (seed {summary['seed']}): {summary['env_steps']} steps in "
        f"{summary['train_seconds']:.1f} s of training ({summary['steps_per_second']:.0f} steps/s), "
        f"{summary['updates']} update{'' if summary['updates'] == 1 else 's'}, stopped by {summary['stop_reason']}",
        evaluation_line(summary, how),
    ]
    syncs = summary.get("weight_syncs") or {}
    if syncs.get("total"):
        each = per_worker(syncs.get("per_worker") or [], syncs.get("total", 0))
        deltas = f", {syncs['delta']} as deltas" if syncs.get("delta") else ""
        lines.append(f"  weight syncs {syncs.get('total', 0)}{each}{deltas}")
    lines.append(f"  bytes {summary.get('bytes', {}).get('total', 0) / 1e6:.2f} MB ({top})")
    if summary.get("restarts"):
        events = (summary.get("details") or {}).get("restart_events") or []
        last = f" (the last: worker {events[-1]['worker']}, {events[-1]['reason']})" if events else ""
        lines.append(f"  workers replaced {summary['restarts']} time(s){last}")
    history = summary.get("eval_history") or []
    if history and history[-1].get("cut_episodes"):
        lines.append(f"  WARNING: {history[-1]['cut_episodes']} evaluation episodes were cut at --eval-max-steps "
                     "before they ended: their returns are partial")
    for key in ("eval_disagreement", "eval_regression"):
        if summary.get(key):
            lines.append(f"  WARNING: {summary[key]['message']}")
    for stall in summary.get("sync_stalls") or []:
        lines.append(f"  WARNING at step {stall['step']}: {stall['message']}")
    for warning in (summary.get("details") or {}).get("warnings") or []:
        lines.append(f"  WARNING at {warning}")
    if summary.get("resumes"):
        lines.append(f"  resumed {len(summary['resumes'])} time(s), last at step {summary['resumes'][-1]['step']}")
    lines.append(f"  run directory: {summary['run_dir']}")
    return "\n".join(lines)
