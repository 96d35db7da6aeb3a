"""The docs' tables of DPSGD (Dong et al.'s HSA2C and DPSVI): speed-up, HSA2C against its A3C baselines, on one
machine and across a shaped link, and DPSVI against gensim and scikit-learn. Renderers of ``docs/gen_tables.py``
(see its ``BENCHES``), on :mod:`table_model`.
"""

from __future__ import annotations

import re

from table_model import DASH, RESULTS, Cell, Num, Pointer, Source, Table, join, opt, pm, pooled


def t_dpsgd_speedup(name: str) -> list[Table]:
    s = Source(name)
    out = []
    marks = {None: "", "at most": "≤ ", "at least": "≥ ", "unknown": "? "}
    for ti, t in enumerate(s("tables")):
        lda = t["task"] == "lda"
        rate_key, rate_name = ("svi_steps_per_s", "SVI steps/s") if lda else ("env_steps_per_s", "env steps/s")
        rows = []
        for ri, r in enumerate(t["rows"]):
            p = ("tables", ti, "rows", ri)
            tt = r["time_to_target"]
            time_cell = [DASH] if tt["mean"] is None else pm(s, (*p, "time_to_target", "mean"),
                                                             (*p, "time_to_target", "std"), ".2f")
            rows.append([[r["label"]], [s.num(*p, "all_processes", fmt="d")], time_cell, [tt["reached"]],
                         ["≥ " if tt["all_lower_bound"] else "", s.num(*p, "time_to_target", "all_mean", fmt=".2f")],
                         [marks[r["speedup_bound"]], s.num(*p, "speedup", fmt=".2f")],
                         [s.num(*p, "efficiency", fmt=".2f")],
                         [s.agg("mean", [(*p, "runs", k, rate_key) for k in range(len(r["runs"]))], ".1f")],
                         [s.num(*p, "bytes_total_mean", scale=1e-6)]])
        unit = "perplexity" if lda else "greedy return"
        out.append(Table(["run", "processes", "time to target, reached seeds (s)", "reached", "time, all seeds (s)",
                          "speed-up", "efficiency", rate_name, "MB sent"], rows, [s.name],
                         [s("runs_from", "command"), s.command()], align="lrrrrrrrr",
                         title=f"{t['task']}: time to {unit} {t['target']:.1f} (reference "
                               f"{t['reference_s']:.2f} s over every seed)"))
    return out


def t_hsa2c_vs_sync(name: str) -> list[Table]:
    s = Source(name)
    tails = all("last_fifth" in r for r in s("rows"))  # absent from the files written before it was recorded
    rescored = next((x["episodes"] for r in s("rows") for x in r.get("rescored") or [] if x), 0)  # likewise
    rows = []
    for i, r in enumerate(s("rows")):
        p = ("rows", i)
        tt = r["time_to_target"]
        time_cell = [DASH] if tt["mean"] is None else pm(s, (*p, "time_to_target", "mean"), (*p, "time_to_target", "std"))
        n = len(r["best_returns"])
        best = join([s.num(*p, "best_returns", k, fmt=".0f") for k in range(n)], " ")
        final = join([s.num(*p, "final_eval_returns", k, fmt=".0f") for k in range(n)], " ")
        rows.append([[r["env"]], [r["variant"]], [f"{r['target']:g}"], time_cell, [tt["reached"]],
                     ["≥ " if r["time_all_seeds"]["lower_bound"] else "", s.num(*p, "time_all_seeds", "mean")],
                     [s.num(*p, "env_steps_per_s", fmt=",.0f")], [s.num(*p, "kb_per_update")],
                     [s.num(*p, "mb_per_100k_steps")], [s.num(*p, "mb_to_target")],
                     [s.num(*p, "staleness_mean", fmt=".2f")], [*best, " / ", *final]])
        if tails:
            means = join([s.num(*p, "last_fifth", k, "mean", fmt=".0f") for k in range(n)], " ")
            rows[-1].append([s.num(*p, "last_fifth_mean", fmt=".0f"), ", std ", s.num(*p, "last_fifth_std", fmt=".0f"),
                             " (", *means, ")"])
        if rescored:
            cell: list = []
            for k, x in enumerate(r["rescored"]):
                cell += [" "] * bool(k) + ([DASH] if x is None else [s.num(*p, "rescored", k, "best", fmt=".0f"), "/",
                                                                    s.num(*p, "rescored", k, "final", fmt=".0f")])
            rows[-1].append(cell)
    header = ["env", "variant", "reference return", "time to reference (s, reached seeds)", "reached",
              "time, all seeds (s)", "env steps/s", "kB per global update", "MB per 100k env steps",
              "MB to reference", "staleness", "best check / final (10 ep.), per seed"]
    if tails:  # over seeds: the mean return of each run's last fifth of checks, the mean of their stds; per seed
        header.append("last fifth of checks: mean, within-run std (per-seed means)")
    if rescored:  # each seed's best.pt and final policy on the same fresh episodes
        header.append(f"best.pt / final on {rescored} fresh episodes, per seed")
    return [Table(header, rows, [s.name], [s.command()], align="llrrrrrrrrrl" + "l" * tails + "l" * bool(rescored))]


def t_lda(name: str) -> list[Table]:
    """Every method of every corpus of one ``lda_baselines.py`` result file."""
    s = Source(name)
    out = []
    for ci, c in enumerate(s("corpora")):
        rows = []
        for mi, m in enumerate(c["methods"]):
            p = ("corpora", ci, "methods", mi)
            has_bytes = "bytes" in m
            rows.append([[m["method"]], [opt(s, (*p, "time_to_target_s"), ".2f")],
                         [opt(s, (*p, "docs_to_target"), ",.0f")], [s.num(*p, "final_perplexity", fmt=".1f")],
                         [s.num(*p, "best_perplexity", fmt=".1f")], [s.num(*p, "train_seconds", fmt=".2f")],
                         [s.num(*p, "docs", fmt=",d")],
                         [s.num(*p, "bytes", "total", scale=1e-6) if has_bytes else Num(None, "", ())],
                         [s.num(*p, "bytes", "gradients", scale=1e-6) if has_bytes else Num(None, "", ())],
                         [opt(s, (*p, "push_ratio_vs_dense_fp32"), ".2f")]])
        sp = c["split"]
        title = (f"{c['corpus']}: {sp['train_docs']:,} training docs, {sp['heldout_docs']} held-out, V = {sp['vocab']:,}, "
                 f"K = {c['K']}, {c['passes']} passes; target perplexity {c['target']:.1f} "
                 f"(1.02 × gensim-w1's final)" if c["target"] else f"{c['corpus']}")
        out.append(Table(["method", "time to target (s)", "docs to target", "final perplexity", "best perplexity",
                          "train s", "docs", "MB on the wire", "MB pushed", "push vs dense fp32"], rows, [s.name],
                         [s.command()], title=title, align="lrrrrrrrrr"))
    return out


def method_path(s: Source, method: str, ci: int = 0) -> Pointer | None:
    for mi, m in enumerate(s("corpora", ci, "methods")):
        if m["method"] == method:
            return ("corpora", ci, "methods", mi)
    return None


def t_lda_seeds(name: str) -> list[Table]:
    """One row per result file: the time to target and final perplexity of each method (synthetic seeds, the
    large corpus's seeds)."""
    files = {"synthetic": ["lda_baselines", "lda_baselines_synthetic_seed1", "lda_baselines_synthetic_seed2"],
             "large": ["lda_baselines_large_seed0", "lda_baselines_large_seed1", "lda_baselines_large_seed2"]}[name]
    methods = ["gensim-w1", "gensim-w2", "sklearn-online", "dpsvi-w1p1", "dpsvi-w2p1"]
    rows = []
    srcs = []
    for f in files:
        s = Source(f)
        srcs.append(s)
        ci = next(i for i, c in enumerate(s("corpora")) if c["corpus"].startswith("synthetic"))
        c = s("corpora", ci)
        seed = c["config"]["seed"]
        row: list[Cell] = [[f"{seed} (target ", s.num("corpora", ci, "target", fmt=".1f"), ")"]]
        for m in methods:
            p = method_path(s, m, ci)
            if p is None:
                row.append([DASH])
                continue
            t = s(*p).get("time_to_target_s")
            row.append(["not reached" if t is None else s.num(*p, "time_to_target_s", fmt=".2f"), ", ",
                        s.num(*p, "final_perplexity", fmt=".1f")])
        if name == "large":
            p = method_path(s, "dpsvi-w1p1", ci)
            row.append([s.num(*p, "bytes", "gradients", scale=1e-6)] if p else [DASH])
            row.append([s.num(*p, "push_ratio_vs_dense_fp32", fmt=".2f", suffix="×")] if p else [DASH])
        rows.append(row)
    header = ["seed", *[f"{m}: s to target, final" for m in methods]]
    if name == "large":
        header += ["dpsvi-w1p1 MB pushed", "smaller than dense fp32"]
    return [Table(header, rows, [s.name for s in srcs], [s.command() for s in srcs])]


def t_lda_variants(name: str) -> list[Table]:
    """DPSVI variants, one file per row: bf16 pushes (``bf16``), dense pushes and larger batches (``large``), the
    asynchronous rate study (``async``), uniform and small batches (``small``)."""
    pattern = {"large": r"lda_(baselines_large_seed\d_dense|large_b\d+_seed\d)\.json",
               "bf16": r"lda_baselines(_synthetic_seed\d|_large_seed\d)?_bf16\.json",
               "async": r"lda_async_.*\.json", "small": r"lda_(baselines_uniform_seed\d|push_bytes_.*)\.json"}[name]
    files = sorted(p.name for p in RESULTS.glob("lda_*.json") if re.fullmatch(pattern, p.name))
    rows = []
    for f in files:
        s = Source(f)
        for ci, c in enumerate(s("corpora")):
            for mi, m in enumerate(c["methods"]):
                if not m["method"].startswith("dpsvi"):
                    continue
                p = ("corpora", ci, "methods", mi)
                t = m.get("time_to_target_s")
                has_bytes = "bytes" in m
                g = method_path(s, "gensim-w1", ci)  # the reference, where this run has it
                rows.append([[f"`{f[:-5]}`"], [f"{c['corpus']}, seed {c['config']['seed']}"], [m["method"]],
                             [opt(s, ("corpora", ci, "target"), ".1f")],
                             ["not reached" if t is None else s.num(*p, "time_to_target_s", fmt=".2f")],
                             [s.num(*p, "final_perplexity", fmt=".1f")],
                             [DASH] if g is None else [s.num(*g, "final_perplexity", fmt=".1f")],
                             [s.num(*p, "bytes", "gradients", scale=1e-6) if has_bytes else Num(None, "", ())],
                             [opt(s, (*p, "push_ratio_vs_dense_fp32"), ".2f")]])
    return [Table(["file", "corpus", "method", "target", "s to target", "final perplexity",
                   "gensim-w1 final (same run)", "MB pushed", "push vs dense fp32"], rows, files)]


def t_hsa2c_link(name: str) -> list[Table]:
    """HSA2C against DDRL A3C with the workers and the parameter server on two hosts (``hsa2c_link.py``): per
    link rate and reference return, both mean times over every seed and their ratios."""
    s = Source(name)
    speed = {(r["rate"], r["variant"].startswith("DDRL")): i for i, r in enumerate(s("rows"))}
    rows = []
    for i, r in enumerate(s("summary")):
        p = ("summary", i)
        ge = {v: "≥ " if r[f"{v}_lower_bound"] else "" for v in ("hsa2c", "a3c")}
        rows.append([[r["rate"]], [f"{r['target']:g}"], [ge["hsa2c"], s.num(*p, "hsa2c_s")], [ge["a3c"], s.num(*p, "a3c_s")],
                     [r["reached"]], ["≤ " if r["hsa2c_lower_bound"] else "", s.num(*p, "a3c_over_hsa2c_time", fmt=".2f", suffix="×")],
                     [s.num(*p, "a3c_over_hsa2c_mb", fmt=".1f", suffix="×")],
                     [s.num("rows", speed[(r["rate"], False)], "env_steps_per_s", fmt=",.0f")],
                     [s.num("rows", speed[(r["rate"], True)], "env_steps_per_s", fmt=",.0f")],
                     [r.get("holds", DASH)]])
    return [Table(["link", "reference return", "HSA2C s (all seeds)", "A3C s (all seeds)", "reached (HSA2C / A3C)",
                   "A3C time / HSA2C time", "A3C MB / HSA2C MB", "HSA2C env steps/s", "A3C env steps/s",
                   "final ≥ 0.9 × best.pt, fresh episodes (HSA2C / A3C)"], rows,
                  [s.name, *(f"{name}_{rate}.json" for rate in s("runs"))], [s.command()],
                  align="lrrrlrrrrl")]


def t_a2c_reference(name: str) -> list[Table]:
    """frugalrl's A2C (as SB3 configures it, and as HSA2C / A3C) against SB3's A2C at equal env steps
    (``a2c_reference.py``); files since the pixel envs also hold sampled-action returns and the bytes sent."""
    s = Source(name)
    sampled = any("stochastic_mean" in r for r in s("rows"))
    rows = []
    for i, r in enumerate(s("rows")):
        p = ("rows", i)
        n = len(r["finals"])
        small = all(abs(x) < 20 for x in r["finals"])  # Breakout's scores: a decimal tells 1.5 from 2
        row = [[r["variant"]], pm(s, (*p, "mean"), (*p, "std")),
               join([s.num(*p, "finals", k, fmt=".1f" if small else ".0f") for k in range(n)], " ")]
        if sampled:
            row += [pm(s, (*p, "stochastic_mean"), (*p, "stochastic_std")) if "stochastic_mean" in r else [DASH],
                    [s.num(*p, "mb_mean", fmt=".0f")] if "mb_mean" in r else [DASH]]
        rows.append([*row, [s.num(*p, "train_s_mean")] if r["train_s_mean"] else [DASH]])  # random: no training
    env = s.get("env", default="LunarLander-v3")
    head = [f"variant ({env})" if sampled else "variant",
            f"final return at {s('steps'):,} env steps, greedy (mean ± std over seeds)", "per seed"]
    if sampled:
        head += ["sampled actions (mean ± std)", "MB on the wire"]
    return [Table([*head, "train s (mean)"], rows, [s.name], [s.command()], align="lrl" + "rr" * sampled + "r")]


# HSA2C without master momentum (μ = 0, the default) against the paper's μ = 0.5, 5 seeds pooled from the files
# of seeds 1-3 and of seeds 4-5 (docs/benchmarks.md#hsa2c-m0-four-tasks-5-seeds)
MOMENTUM_POOLS = {
    "Walker2d-v5 (1M)": (("hsa2c_sweep/walker2d_m0", "hsa2c_sweep/walker2d_m0_seeds45"),
                         ("a2c_reference_walker2d_vs_sb3", "hsa2c_sweep/walker2d_mu05_seeds45")),
    "BipedalWalker-v3 (1M)": (("hsa2c_sweep/bipedal_m0", "hsa2c_sweep/bipedal_m0_seeds45"),
                              ("hsa2c_sweep/bipedal_mu05", "hsa2c_sweep/bipedal_mu05_seeds45")),
    "MinAtar Breakout (2M)": (("hsa2c_sweep/breakout_m0", "hsa2c_sweep/breakout_m0_seeds45"),
                              ("hsa2c_sweep/breakout_mu05", "hsa2c_sweep/breakout_mu05_seeds45")),
    "MinAtar Space Invaders (1M)": (("hsa2c_sweep/space_invaders_m0", "hsa2c_sweep/space_invaders_m0_seeds45"),
                                    ("a2c_reference_minatar_space_invaders", "hsa2c_sweep/space_invaders_mu05_seeds45")),
}


# HSA2C with the cool-down (``eta_anneal`` 0.5, the default) against a constant η, μ = 0 both, 3-5 seeds
# (docs/benchmarks.md#hsa2c-walker2d-cool50)
COOLDOWN_POOLS = {
    "Walker2d-v5 (1M)": (("hsa2c_sweep/walker2d_cool50",),
                         ("hsa2c_sweep/walker2d_m0", "hsa2c_sweep/walker2d_m0_seeds45")),
    "Hopper-v5 (1M)": (("hsa2c_sweep/hopper_cool50",), ("hsa2c_sweep/hopper_m0",)),
    "HalfCheetah-v5 (1M)": (("hsa2c_sweep/halfcheetah_cool50",), ("hsa2c_sweep/halfcheetah_m0",)),
}


def _pooled_settings(pools: dict[str, tuple[tuple[str, ...], ...]], settings: list[str]) -> list[Table]:
    """Final greedy return of the ``hsa2c`` rows of each task, one column pair (mean ± std, per seed) per setting,
    each setting's seeds pooled over its files; ``settings`` names the settings in ``pools``' order."""
    rows, names, commands = [], [], []
    for task, files_of_setting in pools.items():
        columns: list[list[tuple[Source, Pointer]]] = []
        for files in files_of_setting:
            parts: list[tuple[Source, Pointer]] = []
            for f in files:
                s = Source(f)
                i = next(i for i, r in enumerate(s("rows")) if r["variant"] == "hsa2c")
                parts += [(s, ("rows", i, "finals", k)) for k in range(len(s("rows", i, "finals")))]
                names.append(s.name)
                commands.append(s.command())
            columns.append(parts)
        fmt = ".1f" if all(abs(src(*p)) < 30 for parts in columns for src, p in parts) else ".0f"  # Breakout's scores
        row: list[Cell] = [[task]]
        for parts in columns:
            row += [[pooled("mean", parts), " ± ", pooled("std", parts)],
                    join([src.num(*path, fmt=fmt) for src, path in parts], " ")]
        rows.append(row)
    head = ["task (env steps)"] + [h for name in settings for h in (name, "per seed")]
    return [Table(head, rows, names, commands, align="l" + "rl" * len(settings))]


def t_hsa2c_momentum_pooled(_: str) -> list[Table]:
    """μ = 0 against μ = 0.5 (both with a constant η), 5 seeds per task."""
    return _pooled_settings(MOMENTUM_POOLS, ["μ = 0, ρ = 1 (constant η)", "μ = 0.5, ρ = 0.5 (constant η)"])


def t_hsa2c_cooldown_pooled(_: str) -> list[Table]:
    """The cool-down (the default since 2026-11-27) against a constant η, both μ = 0, 3-5 seeds per task."""
    return _pooled_settings(COOLDOWN_POOLS, ["η cooled over the second half (default)", "constant η"])
