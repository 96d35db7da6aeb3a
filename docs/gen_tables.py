"""The docs' generated tables: benchmark tables from ``benchmarks/results/*.json`` and config references
from the config dataclasses. Nothing in a generated table is typed by hand.

Every number in a benchmark table is a :class:`Num`: the value shown, how it was formatted, and where it came
from (JSON files and key paths, and the operation that made it: the value itself, a mean, a ratio...).
``tests/test_docs.py`` re-reads each source with its own JSON walk and checks every number a page shows.

``docs/hooks.py`` replaces the markers in the pages at build time:

* ``<!-- bench: NAME -->`` or ``<!-- bench: NAME ARG -->``: :func:`render_bench` (see :data:`BENCHES`);
* ``<!-- config: module.Class -->``: :func:`render_config`, one row per field (flag, type, default, doc).

``python docs/gen_tables.py --update-readme`` rewrites the README's headline table (between its
``<!-- headline:start -->`` and ``<!-- headline:end -->`` lines) from :func:`headline`; the test fails when
the README's copy differs from the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# the docs' own modules, next to this file; imported afresh, as ``docs/hooks.py`` loads this file afresh
sys.path.insert(0, str(Path(__file__).resolve().parent))
for _name in ("table_model", "tables_dpsgd", "tables_headline", "tables_pipeline", "tables_scale"):
    sys.modules.pop(_name, None)
from table_model import (  # noqa: E402
    DASH,
    RESULTS,
    RESULTS_URL,
    ROOT,
    Cell,
    Num,
    Source,
    Table,
    cell_text,
    cross,
    join,
    mean_std,
    opt,
    pm,
)
from tables_dpsgd import (  # noqa: E402
    t_a2c_reference,
    t_dpsgd_speedup,
    t_hsa2c_cooldown_pooled,
    t_hsa2c_link,
    t_hsa2c_momentum_pooled,
    t_hsa2c_vs_sync,
    t_lda,
    t_lda_seeds,
    t_lda_variants,
)
from tables_headline import t_headline  # noqa: E402
from tables_pipeline import (  # noqa: E402
    t_pipeline_carracing,
    t_pipeline_defaults,
    t_pipeline_shaped_link,
    t_pipeline_suite,
    t_pipeline_table1,
)
from tables_scale import (  # noqa: E402
    t_link_ingress,
    t_link_latency,
    t_link_latency_rounds,
    t_link_pacing,
    t_link_pacing_summary,
    t_link_rtt,
    t_link_stepcost_summary,
    t_scale_model,
    t_scale_model_paced,
    t_scale_model_parts,
)

__all__ = ["Cell", "Num", "Source", "Table", "cell_text", "cross", "join", "mean_std", "opt", "pm"]

# ------------------------------------------------------------------------------ PPO, AAPS, ClusterEnv
def t_ppo_lunarlander(_: str) -> list[Table]:
    s = Source("ppo_lunarlander")
    t = s("target")
    rows = []
    for i, _r in enumerate(s("rows")):
        p = ("rows", i)
        rows.append([[s.num(*p, "seed", fmt="d")], pm(s, (*p, "eval_return_mean"), (*p, "eval_return_std")),
                     [s.num(*p, "best_eval")], [s.num(*p, "steps_to_target", fmt=",.0f")],
                     [s.num(*p, "seconds_to_target", fmt=".0f")], [s.num(*p, "wall_seconds", fmt=".0f")],
                     [s.num(*p, "weight_syncs", fmt="d")]])
    rows.append([["mean"], [s.num("final_eval_mean_over_seeds")], [""], [""], [""], [""], [""]])
    return [Table(["seed", "final eval (10 episodes)", "best eval", f"env steps to eval ≥ {t:g}",
                   f"s to eval ≥ {t:g}", "wall s (1M steps)", "weight syncs (4 workers)"], rows,
                  [s.name], [s.command()])]


def t_aaps(name: str) -> list[Table]:
    s = Source(name)
    rows = []
    for i, r in enumerate(s("rows")):
        p = ("rows", i)
        rows.append([[r["sync"]], [s.num(*p, "final_eval_return")], [s.num(*p, "final_train_return")],
                     [s.num(*p, "syncs_per_worker_mean")], [s.num(*p, "weight_bytes", fmt=".2f", scale=1e-6)],
                     [s.num(*p, "weight_bytes_ratio_vs_every", suffix="×")],
                     [s.num(*p, "policy_lag_mean", fmt=".2f")], [s.num(*p, "wall_seconds", fmt=".0f")]])
    seeds = ", ".join(map(str, s("seeds")))
    return [Table(["sync", f"final eval return (mean over seeds {seeds})", "train return (last 100 ep.)",
                   "syncs / worker", "weight MB", "fewer weight bytes than EveryUpdate", "mean policy lag",
                   "wall s"], rows, [s.name], [s.command()])]


def t_uplink(_: str) -> list[Table]:
    s = Source("uplink")
    kinds = ["observations", "actions", "rewards", "behaviour", "weights", "info", "control", "total",
             "uplink_total"]
    labels = {"every": "every-update, raw fp32", "raw": "AAPS, raw fp32", "auto": "AAPS + `--uplink auto` (default)",
              "int8": "AAPS + auto + `--uplink-obs int8`"}
    rows = []
    for key, r in s("settings").items():
        p = ("settings", key)
        n = len(r["runs"])
        rows.append([[labels.get(key, key)], *[[s.num(*p, "bytes_per_step", k, fmt=".2f")] for k in kinds],
                     mean_std(s, [(*p, "eval_returns", i) for i in range(n)]),
                     [", ".join(str(x) for x in r["seeds"])], [s.num(*p, "steps_per_second", fmt=".0f")]])
    by_kind = Table(["setting", *kinds[:-2], "**total**", "uplink total", "final eval return", "seeds", "steps/s"],
                    rows, [s.name], [s.command()],
                    title=f"Bytes per env step, by kind ({s('steps'):,} steps of the `make demo` settings, mean over "
                          "seeds)")
    rows = []
    for u, o in s("codec_time", "options").items():
        p = ("codec_time", "options", u)
        codecs = ", ".join(f"{k} {v}" for k, v in o["codecs"].items()) or "raw"
        err: Cell = (["exact"] if o["options"]["obs"] == "exact"
                     else [s.num(*p, "obs_max_error_in_std", fmt=".3f"), " std"])
        rows.append([[u], [s.num(*p, "total_per_step", fmt=".2f")], [s.num(*p, "encode_us_per_step", fmt=".3f")],
                     [s.num(*p, "decode_us_per_step", fmt=".3f")], err, [codecs]])
    n = s("codec_time", "env_steps")
    codec = Table(["uplink", "bytes / env step", "encode µs / step", "decode µs / step", "largest obs error",
                   "codecs"], rows, [s.name],
                  title=f"Codec CPU time on {n:,} recorded env steps (one thread, best of "
                        f"{s('codec_time', 'repeats')})")
    tables = [by_kind, codec]
    if "ale" in s.data:
        rows = []
        for u, r in s("ale", "runs").items():
            p = ("ale", "runs", u)
            rows.append([[labels.get(u, u)], [s.num(*p, "bytes_per_step", "observations", fmt=".1f")],
                         [s.num(*p, "bytes_per_step", "total", fmt=".1f")], [s.num(*p, "steps_per_second", fmt=".0f")],
                         [", ".join(f"{k} ×{v}" for k, v in r["obs_codecs"].items()) or "raw"]])
        tables.append(Table(["setting", "observations B / step", "total B / step", "steps/s", "observation codec"],
                            rows, [s.name], title=f"ALE Pong, 4×84×84 uint8 frame stacks, PPO (Nature CNN, AAPS), "
                                                  f"{s('ale', 'steps'):,} env steps"))
    return tables


def _suite_ppo_rows(s: Source) -> Iterator[tuple[str, dict, str, dict, tuple]]:
    """The learning suite's PPO rows (frugalrl's and SB3's): env, its table entry, variant, row, path of the row."""
    for env, e in s("table").items():
        for v, r in e["variants"].items():
            if v.startswith(("frugal-", "sb3-")):
                yield env, e, v, r, ("table", env, "variants", v)


def t_learning_suite_ppo(name: str) -> list[Table]:
    s = Source(name or "learning_suite")
    rows = []
    for env, e, v, r, p in _suite_ppo_rows(s):
        secs = [(*p, "seconds_to_reference", i) for i in range(len(r["seconds_to_reference"]))]
        rows.append([[f"{env} ({e['steps'] / 1e3:.0f}k)"], [v], pm(s, (*p, "final_return_mean"), (*p, "final_return_std")),
                     [opt(s, (*p, "return_vs_sb3"), ".2f")], [s.num(*p, "stochastic_return_mean")],
                     [s.num(*p, "reached_reference", fmt="d"), f"/{len(r['seeds'])} (≥ {e['reference']})"],
                     [s.agg("mean", secs, ".0f")], [s.num(*p, "train_seconds_mean", fmt=".0f")],
                     [opt(s, (*p, "train_seconds_vs_sb3"), ".2f")], [s.num(*p, "wall_seconds_mean", fmt=".0f")],
                     [opt(s, (*p, "wall_vs_sb3"), ".2f")], [s.num(*p, "bytes_total_mean", fmt=".1f", scale=1e-6)],
                     [s.num(*p, "bytes_weights_mean", fmt=".2f", scale=1e-6)],
                     [s.num(*p, "weight_syncs_mean", fmt=".0f")], [s.num(*p, "stuck_fraction_max", fmt=".0%")]])
    return [Table(["env (steps)", "variant", "final return (mean ± std, 3 seeds)", "× SB3", "stochastic",
                   "reached ref.", "s to ref. (mean)", "train s", "× SB3 train s", "wall s", "× SB3 wall", "MB total",
                   "weight MB", "syncs", "stuck"], rows, [s.name],
                  [s.command() if name else "python benchmarks/learning_suite.py"])]


def t_learning_suite_seeds(name: str) -> list[Table]:
    """The suite's PPO rows with the spread over seeds: ratios to SB3 with their bootstrap intervals, of the final
    evaluation and of the mean of the last three."""
    s = Source(name)
    rows = []

    def interval(path: tuple) -> Cell:
        if s.get(*path) is None:
            return [DASH]
        return [s.num(*path, 0, fmt=".2f"), "–", s.num(*path, 1, fmt=".2f")]

    for env, e, v, r, p in _suite_ppo_rows(s):
        rows.append([[f"{env} ({e['steps'] / 1e3:.0f}k)"], [v], [str(len(r["seeds"]))],
                     pm(s, (*p, "final_return_mean"), (*p, "final_return_std")),
                     [opt(s, (*p, "return_vs_sb3"), ".2f")], interval((*p, "return_vs_sb3_ci90")),
                     [s.num(*p, "late_return_mean")], [opt(s, (*p, "late_return_vs_sb3"), ".2f")],
                     interval((*p, "late_return_vs_sb3_ci90")), [opt(s, (*p, "return_vs_every_fp32"), ".2f")],
                     interval((*p, "return_vs_every_fp32_ci90"))])
    return [Table(["env (steps)", "variant", "seeds", "final return (mean ± std)", "× SB3", "90 % interval",
                   "last 3 evals", "× SB3", "90 % interval", "× every-update fp32", "90 % interval"], rows, [s.name],
                  [s.command()])]


def t_learning_suite_impala(_: str) -> list[Table]:
    s = Source("learning_suite")
    rows = []
    for env, e in s("table").items():
        for v, r in e["variants"].items():
            if not v.startswith("impala-"):
                continue
            p = ("table", env, "variants", v)
            secs = [(*p, "seconds_to_reference", i) for i in range(len(r["seconds_to_reference"]))]
            rows.append([[f"{env} ({e['impala_steps'] / 1e3:.0f}k)"], [v],
                         pm(s, (*p, "final_return_mean"), (*p, "final_return_std")),
                         [opt(s, (*p, "return_vs_copy"), ".2f")], [s.num(*p, "late_return_mean")],
                         [opt(s, (*p, "late_return_vs_copy"), ".2f")], [s.num(*p, "stochastic_return_mean")],
                         [s.num(*p, "train_return_mean")],
                         [s.num(*p, "reached_reference", fmt="d"), f"/{len(r['seeds'])} (≥ {e['reference']})"],
                         [s.agg("mean", secs, ".0f")], [opt(s, (*p, "seconds_to_reference_vs_copy"), ".2f")],
                         [s.num(*p, "learner_share", fmt=".0%")], [s.num(*p, "bytes_total_mean", fmt=".1f", scale=1e-6)],
                         [s.num(*p, "bytes_weights_mean", fmt=".2f", scale=1e-6)],
                         [opt(s, (*p, "weight_bytes_fewer_than_every_copy"), ".2f")],
                         [s.num(*p, "weight_syncs_mean", fmt=".0f")], [s.num(*p, "eval_disagreements", fmt="d")],
                         [str(len(r["warnings"]))]])
    return [Table(["env (steps)", "actors", "final (det.)", "× copy", "last 3 evals", "× copy", "stochastic",
                   "train (last 100)", "reached ref.", "s to ref.", "× copy s", "learner share", "MB total", "weight MB",
                   "× fewer weight bytes than every-update copies", "syncs", "disagreements", "guard warnings"], rows,
                  [s.name], ["python benchmarks/learning_suite.py --envs CartPole-v1 LunarLander-v3 MinAtar-Breakout "
                             "ALE-Breakout --variants impala-copy impala-int8 impala-full"])]


# ------------------------------------------------------------------------------------------ AcceRL
def t_compress_table6(_: str) -> list[Table]:
    s = Source("compress_table6")
    rows = []
    for i, r in enumerate(s("rows")):
        p = ("rows", i)
        rows.append([[r["network"]], [r["arch"]], [r["runtime"]], [s.num(*p, "params", fmt=",d")],
                     [s.num(*p, "wire_bytes", fmt=",d")], [s.num(*p, "ms_per_state", "1", fmt=".3f")],
                     [s.num(*p, "ms_per_state", "16", fmt=".3f")],
                     [s.num(*p, "speedup_vs_torch_fp32_original", "1", fmt=".2f", suffix="×")],
                     [s.num(*p, "speedup_vs_torch_fp32_original", "16", fmt=".2f", suffix="×")],
                     [s.num(*p, "kl_mean", fmt=".1e")],
                     [s.num(*p, "paper_ms", fmt=".1f")]])
    return [Table(["network", "conv (kernel) / fc", "runtime", "params", "weight bytes", "ms/state b=1",
                   "ms/state b=16", "speed-up b=1", "speed-up b=16", "KL mean to original", "paper's ms"], rows,
                  [s.name], [s("machine", "command")])]


def t_accerl_actor_time(_: str) -> list[Table]:
    s = Source("accerl_actor_time")
    groups: dict[tuple[str, int], dict[str, int]] = {}
    for i, r in enumerate(s("rows")):
        groups.setdefault((r["env"], r["envs_per_worker"]), {})[r["actor"]] = i
    actors = list(dict.fromkeys(r["actor"] for r in s("rows")))
    rows = []
    for (env, k), idx in groups.items():
        cells: list[Cell] = [[env], [str(k)]]
        for a in actors:
            p = ("rows", idx[a])
            cell: Cell = [s.num(*p, "ms_per_state", fmt=".3f")]
            if a != actors[0]:
                cell += [" (", s.num(*p, "speedup", fmt=".2f", suffix="×"), ")"]
            cells.append(cell)
        rows.append(cells)
    return [Table(["env", "envs / worker", *[f"`{a}` (ms)" for a in actors]], rows, [s.name], [s.command()])]


def t_impala_ablation(_: str) -> list[Table]:
    s = Source("impala_ablation")
    runs = s("runs")

    def extra(r: dict[str, Any]) -> str:
        return json.dumps(r.get("extra", {}), sort_keys=True)

    keys = sorted({(r["env"], r["steps"], extra(r)) for r in runs})
    rows = []
    for env, steps, ex in keys:
        for name in s("settings"):
            sel = [i for i, r in enumerate(runs) if (r["env"], r["steps"], extra(r), r["setting"]) == (env, steps, ex, name)]
            if not sel:
                continue

            def m(key: str, sel: list[int] = sel) -> Cell:
                return mean_std(s, [("runs", i, key) for i in sel])

            flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in json.loads(ex).items()) or DASH
            rows.append([[f"{env} ({steps / 1e6:g}M)"], [name], [flags], [str(len(sel))], m("final_return"),
                         m("stochastic_return"), m("train_return_last100"), m("best_eval"),
                         [s.agg("mean", [("runs", i, "train_seconds") for i in sel], ".0f")],
                         [s.agg("mean", [("runs", i, "learner_update_seconds") for i in sel], ".0f")]])
    return [Table(["env (steps)", "setting", "extra flags", "seeds", "final (det.)", "stochastic", "train (last 100)",
                   "best eval", "train s", "update s"], rows, [s.name], ["python benchmarks/impala_ablation.py"])]


# ----------------------------------------------------------------------------------------- scale-out
def t_shaped_links(_: str) -> list[Table]:
    s = Source("shaped_links")
    rows = []
    for i, r in enumerate(s("runs")):
        p = ("runs", i)
        rows.append([[r["rate"]], ["EveryUpdate" if r["sync"] == "every" else "AAPS δ=0.05"],
                     [s.num(*p, "s_per_iter", fmt=".0f", scale=1e3)], [s.num(*p, "s_per_iter_median", fmt=".0f", scale=1e3)],
                     [s.num(*p, "weight_syncs", fmt="d")], [s.num(*p, "bytes", "weights", fmt=".2f", scale=1e-6)],
                     [s.num(*p, "bytes", "total", fmt=".2f", scale=1e-6)]])
    return [Table(["link", "sync", "ms / iteration (mean)", "ms / iteration (median)", "weight syncs", "weights MB",
                   "total MB"], rows, [s.name], [s.command()])]


def t_ray_overhead(_: str) -> list[Table]:
    s = Source("ray_overhead")
    c = s("config")
    rows = [[[f"{c['env']}, {c['workers']} workers × {c['envs_per_worker']} envs, rollouts of {c['steps']} steps"],
             [s.num("steps_per_s", "local", "median", fmt=",.0f")], [s.num("steps_per_s", "ray", "median", fmt=",.0f")],
             [s.num("slowdown_ray_vs_local", fmt=".2f", suffix="×")], [s.num("target_slowdown", fmt=".1f", prefix="≤ ", suffix="×")],
             ["yes" if s("same_bytes") else "no"]]]
    return [Table(["setting", "local steps/s (median)", "Ray steps/s (median)", "Ray slower by", "target",
                   "identical byte counts"], rows, [s.name], ["python benchmarks/ray_overhead.py"])]


def t_throughput(_: str) -> list[Table]:
    s = Source("throughput")
    envs = list(s("results"))
    methods = list(s("results", envs[0], "methods"))
    rows = []
    for m in methods:
        rows.append([[s("results", envs[0], "methods", m, "label")],
                     *[[s.num("results", e, "methods", m, "steps_per_s", fmt=",.0f")] for e in envs]])
    for key, label in (("head_vs_async", "**head-side / AsyncVectorEnv** (target ≥ {t})"),
                       ("efficiency", "**parallel efficiency** = rollout / (2 × baseline) (target ≥ {t})")):
        row: list[Cell] = [[label.format(t=s("targets", key))]]
        for e in envs:
            pr = s("results", e, "paired_ratios", key)
            lo, hi = min(range(len(pr)), key=pr.__getitem__), max(range(len(pr)), key=pr.__getitem__)
            row.append([s.num("results", e, "ratios", key, fmt=".2f"), " (",
                        s.num("results", e, "paired_ratios", key, lo, fmt=".2f"), "–",
                        s.num("results", e, "paired_ratios", key, hi, fmt=".2f"), ")"])
        rows.append(row)
    return [Table(["env steps/s", *envs], rows, [s.name], [s("machine", "command")], align="l" + "r" * len(envs))]


def t_long_runs(name: str) -> list[Table]:
    """``benchmarks/long_runs.py``: each process's memory over a run with no faults, then what a long run's metrics
    file costs at a resume and in the end-of-run plots, before and after a change."""
    s = Source(name)
    rows: list[list[Cell]] = []
    for i, run in enumerate(s("runs")):
        workers = 0
        for key in run["memory"]:
            role = key.split(":")[0]
            workers += role == "worker"
            p = ("runs", i, "memory", key)
            first = key == next(iter(run["memory"]))  # the run's own figures on its first row
            rows.append([[f"`{run['run']}`" if first else ""], [role if role != "worker" else f"worker {workers}"],
                         [s.num("runs", i, "env_steps", fmt=",.0f")] if first else [""],
                         [s.num("runs", i, "metrics_rows", fmt=",.0f")] if first else [""],
                         [s.num(*p, "warm_mb")], [s.num(*p, "peak_mb")], [s.num(*p, "end_mb")],
                         [s.num(*p, "growth_mb_per_min", fmt=".2f")]])
    memory = Table(["run (algo:env:inline workers)", "process", "env steps", "metrics rows", "MB a third in", "peak MB",
                    "end MB", "MB / min after"], rows, [s.name], [s.command()], align="llrrrrrr")
    m = ("metrics",)
    cost_rows: list[list[Cell]] = []
    for what, label in (("resume", "resume: cut to the checkpoint's step"), ("plots", "end-of-run plots")):
        cost_rows.append([[s.num(*m, "rows", fmt=",.0f"), " rows (", s.num(*m, "file_mb", fmt=".0f"), " MB)"], [label],
                          *[[s.num(*m, side, what, key, fmt=fmt)] for side in ("before", "now")
                            for key, fmt in (("seconds", ".1f"), ("peak_mb", ",.0f"))]])
    costs = Table(["metrics.jsonl", "what the run does with it", "before: s", "peak MB", "now: s", "peak MB"],
                  cost_rows, [s.name], [s.command()], align="llrrrr")
    return [memory, costs]


def t_dropin_speed(name: str) -> list[Table]:
    s = Source(name)
    names = ("async", "step", "pool", "rollout", "floor")
    headers = ["AsyncVectorEnv (k per process)", "ClusterEnv step()", "send / recv", "rollout()",
               "floor (bare processes)"]
    kept = [i for i, m in enumerate(names) if any(m in row["vs_sync"] for row in s("rows"))]  # older runs: no floor
    rows = []
    for i, row in enumerate(s("rows")):
        rows.append([[f"{row['env']}, {row['workers']} workers × {row['envs_per_worker']} envs"],
                     [s.num("rows", i, "steps_per_s", "sync", fmt=",.0f")],
                     *[[s.num("rows", i, "vs_sync", names[j], fmt=".2f", suffix="×")] for j in kept]])
    return [Table(["env, layout", "SyncVectorEnv steps/s", *[headers[j] for j in kept]], rows, [s.name],
                  [s("command")], align="lr" + "r" * len(kept))]


def t_family_defaults(_: str) -> list[Table]:
    """What a run with no flags gets, per env: the defaults (frugal syncs on), the same with every-update fp32
    weights, SB3's plain defaults; the returns by seed, their mean and median, and their ratios."""
    s = Source("family_defaults")
    rows = []
    for env, sides in s("table").items():
        for side in [k for k in sides if not k.startswith("ratio")]:
            p = ("table", env, side)
            by_seed: list = []  # "101: 9323.5, 102: ..." (validation sides ran on other seeds than the report)
            for i, seed in enumerate(s(*p, "seeds")):
                by_seed += [", " if i else "", f"{seed}: ", s.num(*p, "returns", i)]
            rows.append([[env], [side], by_seed, [s.num(*p, "mean")], [s.num(*p, "median")]])
        for key in [k for k in sides if k.startswith("ratio")]:  # each names its sides (family_defaults.RATIOS)
            rows.append([[env], [sides[key]["label"]], [""],
                         [s.num("table", env, key, "mean", fmt=".2f", suffix="×")],
                         [s.num("table", env, key, "median", fmt=".2f", suffix="×")]])
    return [Table(["env", "side", "return by seed", "mean", "median"], rows, [s.name], [s.command()],
                  align="llrrr")]


UNRECORDED_COMMANDS = {  # result files that do not record the command that wrote them
    "impala_ablation": "python benchmarks/impala_ablation.py",
    "ray_overhead": "python benchmarks/ray_overhead.py",
}


def t_index(_: str) -> list[Table]:
    """Every result file with the command that wrote it."""
    rows = []
    for f in sorted(RESULTS.glob("*.json")):
        s = Source(f.name)
        command = s.command() or UNRECORDED_COMMANDS.get(f.stem, "")
        rows.append([[f"[`{f.name}`]({RESULTS_URL}/{f.name})"], [f"`{command}`" if command else DASH]])
    return [Table(["file", "command"], rows)]


BENCHES: dict[str, Callable[[str], list[Table]]] = {
    "headline": t_headline,
    "index": t_index,
    "ppo_lunarlander": t_ppo_lunarlander,
    "aaps": t_aaps,  # ARG: aaps_sweep or aaps_3seeds
    "uplink": t_uplink,
    "learning_suite_ppo": t_learning_suite_ppo,  # ARG: learning_suite.py's --out (default learning_suite)
    "learning_suite_impala": t_learning_suite_impala,
    "learning_suite_seeds": t_learning_suite_seeds,  # ARG: learning_suite.py's --out
    "compress_table6": t_compress_table6,
    "accerl_actor_time": t_accerl_actor_time,
    "impala_ablation": t_impala_ablation,
    "pipeline_table1": t_pipeline_table1,
    "pipeline_shaped_link": t_pipeline_shaped_link,
    "pipeline_carracing": t_pipeline_carracing,
    "pipeline_suite": t_pipeline_suite,  # ARG: pipeline_suite or pipeline_accumulator
    "pipeline_defaults": t_pipeline_defaults,  # ARG: pipeline_defaults.py's --out
    "dpsgd_speedup": t_dpsgd_speedup,  # ARG: dpsgd_speedup_lda or dpsgd_speedup_hsa2c
    "hsa2c_vs_sync": t_hsa2c_vs_sync,  # ARG: a hsa2c_vs_sync*.json name (or a hsa2c_link_RATE one)
    "hsa2c_link": t_hsa2c_link,  # ARG: hsa2c_link.py's --out
    "a2c_reference": t_a2c_reference,  # ARG: a2c_reference.py's --out
    "hsa2c_momentum_pooled": t_hsa2c_momentum_pooled,
    "hsa2c_cooldown_pooled": t_hsa2c_cooldown_pooled,
    "lda": t_lda,  # ARG: an lda_baselines.py result name
    "lda_seeds": t_lda_seeds,  # ARG: synthetic or large
    "lda_variants": t_lda_variants,  # ARG: bf16, large, async or small
    "shaped_links": t_shaped_links,
    "ray_overhead": t_ray_overhead,
    "throughput": t_throughput,
    "dropin_speed": t_dropin_speed,
    "long_runs": t_long_runs,  # ARG: long_runs.py's --out
    "family_defaults": t_family_defaults,
    "scale_model": t_scale_model,  # ARG: shaped_links.py's --out with several --workers
    "link_latency": t_link_latency,  # ARGS: shaped_links.py --delays' --out, now and before weights rode in requests
    "link_ingress": t_link_ingress,  # ARGS: one shaped_links.py command's --out without, then with --ingress
    "link_rtt": t_link_rtt,  # ARGS: link_rtt.py --out
    "link_pacing": t_link_pacing,  # ARGS: shaped_links.py --out files remodelled with --pacing
    "link_pacing_summary": t_link_pacing_summary,  # ARGS: the same, of any rates
    "link_stepcost_summary": t_link_stepcost_summary,  # ARGS: shaped_links.py --out files remodelled with --step-cost
    "link_latency_rounds": t_link_latency_rounds,  # ARGS: the same shaped_links.py --delays command's --out, per round
    "scale_model_paced": t_scale_model_paced,  # ARG: learner_capacity.py --pace's --out
    "scale_model_parts": t_scale_model_parts,  # ARG: learner_capacity.py --backend local --pace worker's --out
}
DEFAULT_ARG = {"headline": "site", "aaps": "aaps_sweep", "pipeline_suite": "pipeline_suite", "dpsgd_speedup": "dpsgd_speedup_lda",
               "hsa2c_vs_sync": "hsa2c_vs_sync_defaults", "hsa2c_link": "hsa2c_link", "a2c_reference": "a2c_reference", "lda": "lda_baselines", "lda_seeds": "synthetic",
               "lda_variants": "large", "scale_model": "shaped_links_scale",
               "scale_model_paced": "learner_capacity_paced", "scale_model_parts": "learner_capacity_local_16cores",
               "dropin_speed": "dropin_speed", "long_runs": "long_runs"}


def bench_tables(spec: str) -> list[Table]:
    """The tables of marker ``spec`` (``NAME`` or ``NAME ARG``)."""
    name, _, arg = spec.strip().partition(" ")
    if name not in BENCHES:
        raise ValueError(f"unknown bench table {name!r}; known: {', '.join(BENCHES)}")
    return BENCHES[name](arg.strip() or DEFAULT_ARG.get(name, ""))


def render_bench(spec: str) -> str:
    """Markdown of marker ``spec``."""
    return "\n\n".join(t.markdown() for t in bench_tables(spec))


# -------------------------------------------------------------------------------------- config tables
def _type_name(t: Any) -> str:
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(t))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(t))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(t))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if t is type(None):
        return "None"
    return getattr(t, "__name__", str(t).replace("typing.", ""))


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:
        v = f.default_factory()
    else:
        return "required"
    return json.dumps(v) if isinstance(v, dict | list | tuple | str) else str(v)


def config_rows(cls: type) -> list[dict[str, str]]:
    """One row per field of dataclass ``cls``: flag (or the name of a field a run only records), type, default, doc,
    and the part that declares it."""
    from frugalrl.config import field_docs, is_flag

    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = []
    for f in dataclasses.fields(cls):
        part = next((k.__name__ for k in reversed(cls.__mro__)
                     if dataclasses.is_dataclass(k) and f.name in k.__dict__.get("__annotations__", {})), cls.__name__)
        flag = "--" + f.name.replace("_", "-") if is_flag(f) else f"{f.name} (config.json only)"
        rows.append({"name": f.name, "flag": flag, "type": _type_name(hints[f.name]), "default": _default_text(f),
                     "doc": " ".join(docs.get(f.name, "").split()), "part": part})
    return rows


def render_config(path: str) -> str:
    """The reference table of config class ``path`` (``module.Class``)."""
    import importlib

    module, _, name = path.strip().rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{path} is not a dataclass")
    rows = config_rows(cls)
    parts = list(dict.fromkeys(r["part"] for r in rows))
    composed = len(parts) > 1
    lines = []
    if composed:
        lines += [f"`{name}` is composed of " + ", ".join(f"`{p}`" for p in parts)
                  + " (the part that declares each field is in the last column).", ""]
    lines += ["| flag | type | default | description |" + (" part |" if composed else ""),
              "|---|---|---|---|" + ("---|" if composed else "")]
    for r in rows:
        doc = (r["doc"] or DASH).replace("|", "\\|")
        default = r["default"].replace("|", "\\|")
        lines.append(f"| `{r['flag']}` | {r['type']} | `{default}` | {doc} |" + (f" `{r['part']}` |" if composed else ""))
    lines += ["", f"<small>Generated from the dataclass `{path}` and its attribute docstrings "
              f"(`frugalrl.config.field_docs`).</small>"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- README
README = ROOT / "README.md"
HEAD_START, HEAD_END = "<!-- headline:start -->", "<!-- headline:end -->"


def readme_headline() -> str:
    """The headline table as the README holds it (no source footer: each row links its JSON)."""
    (t,) = t_headline("readme")
    return t.markdown()


def update_readme() -> bool:
    """Rewrite the README's headline table from the JSON; True if it changed."""
    text = README.read_text()
    start, end = text.index(HEAD_START) + len(HEAD_START), text.index(HEAD_END)
    new = text[:start] + "\n" + readme_headline() + "\n" + text[end:]
    if new != text:
        README.write_text(new)
    return new != text


if __name__ == "__main__":
    if sys.argv[1:] == ["--update-readme"]:
        print("README.md updated" if update_readme() else "README.md already up to date")
    elif sys.argv[1:2] == ["--bench"]:
        print(render_bench(" ".join(sys.argv[2:])))
    elif sys.argv[1:2] == ["--config"]:
        print(render_config(sys.argv[2]))
    else:
        print("usage: python docs/gen_tables.py --update-readme | --bench NAME [ARG] | --config module.Class")
        sys.exit(2)
