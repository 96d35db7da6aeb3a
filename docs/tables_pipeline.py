"""The pipeline PPO tables (:mod:`frugalrl.pipeline`): the paper's Table I, the shaped link, CarRacing, the
learning suite and the no-flag defaults. Renderers of ``docs/gen_tables.py``, registered there by name."""

from __future__ import annotations

from table_model import DASH, Cell, Source, Table, cross, join, opt, pm


def t_pipeline_table1(_: str) -> list[Table]:
    """Table I of the pipeline paper, computed by :func:`frugalrl.pipeline.bytes.table_one` at build time."""
    from frugalrl.pipeline.bytes import table_one

    rows = []
    for r in table_one():
        el = f"{r['elements'] / 1e9:.1f} B" if r["elements"] else ""
        bpe = f"{r['bytes_per_element']:g}" if r["bytes_per_element"] else ""
        rows.append([[r["setup"].strip()], [el], [bpe], [f"{r['bytes'] / 1e9:.2f} GB"], [f"{r['relative']:.2f}×"],
                     [r["note"]]])
    return [Table(["setup", "elements", "B / element", "bytes", "vs paper's cloud", "note"], rows,
                  commands=["frugalrl pipeline-bytes"], align="lrrrrl")]


def t_pipeline_shaped_link(_: str) -> list[Table]:
    s = Source("pipeline_shaped_link")
    rows = []
    for i, r in enumerate(s("runs")):
        p = ("runs", i)
        rows.append([[r["rate"]], [r["variant"]], [s.num(*p, "median_iteration_s")],
                     [s.num(*p, "comm_wait_s_per_iter_stage0", suffix=" s")],
                     [s.num(*p, "bytes_per_iter", "total", scale=1e-6), " (",
                      s.num(*p, "bytes_per_iter", "gradients", fmt=".2f", scale=1e-6), ")"],
                     [s.num(*p, "time_ratio_vs_dense", fmt=".2f")]])
    return [Table(["link", "cut gradients", "s / iteration (median)", "stage-0 comm wait / iteration",
                   "MB / iteration (gradients)", "time vs dense"], rows, [s.name], ["python benchmarks/pipeline_shaped_link.py"])]


def t_pipeline_carracing(_: str) -> list[Table]:
    rows = []
    names = []
    for name in ("pipeline_carracing", "pipeline_carracing_sa"):
        s = Source(name)
        names.append(s.name)
        dense = Source("pipeline_carracing")
        for v, r in s("table").items():
            p = ("table", v)
            seeds = [(*p, "return_per_seed", i) for i in range(len(r["return_per_seed"]))]
            ret: Cell = [s.num(*p, "return_mean")]
            if len(seeds) > 1:
                ret += [" ± ", s.agg("std", seeds), " (", *join([s.num(*q) for q in seeds]), ")"]
            else:
                ret += [" (1 seed)"]
            rows.append([[v], ret, [s.num(*p, "total_bytes", fmt=",.0f", scale=1e-6)],
                         [cross(s, (*p, "total_bytes"), dense, ("table", "dense", "total_bytes"), ".3f")],
                         [s.num(*p, "gradient_bytes", fmt=",.0f", scale=1e-6)],
                         [cross(s, (*p, "gradient_bytes"), dense, ("table", "dense", "gradient_bytes"), ".3f")],
                         [s.num(*p, "activation_bytes", fmt=",.0f", scale=1e-6)],
                         [s.num(*p, "iteration_seconds_median")]])
    return [Table(["cut gradients", "return (mean ± std, per seed)", "total MB", "vs dense", "gradient MB", "vs dense",
                   "activation MB", "s / iteration"], rows, names,
                  ["python benchmarks/pipeline_carracing.py",
                   "python benchmarks/pipeline_carracing.py --variants p0.99-sa --seeds 1 --out pipeline_carracing_sa"])]


def t_pipeline_suite(name: str) -> list[Table]:
    s = Source(name)
    study = "accumulator" if "accumulator" in name else "cuts"
    rows = []
    for env, e in s("table").items():
        for v, a in e["variants"].items():
            p = ("table", env, "variants", v)
            seeds = [s.num(*p, "final_return_per_seed", i, fmt=".0f") for i in range(len(a["final_return_per_seed"]))]
            rows.append([[f"{env} ({e['steps'] / 1e3:.0f}k)"], [v], pm(s, (*p, "final_return_mean"), (*p, "final_return_std")),
                         join(seeds), [opt(s, (*p, "return_gap_vs_base"), "+.1%")],
                         [s.num(*p, "gradient_bytes_mean", scale=1e-6)], [opt(s, (*p, "gradients_vs_base"), ".3f")],
                         [s.num(*p, "total_bytes_mean", scale=1e-6)], [s.num(*p, "train_seconds_mean", fmt=".0f")]])
    first = "cut gradients (accumulator `position`)" if study == "cuts" else "accumulator (p = 0.99)"
    base = "dense" if study == "cuts" else "position"
    return [Table(["env (steps)", first, "final return (mean ± std)", "per seed", f"vs {base}", "gradient MB",
                   "× gradients", "total MB", "train s"], rows, [s.name], [s.command()])]


def t_pipeline_defaults(name: str) -> list[Table]:
    """``benchmarks/pipeline_defaults.py``: one row per seed of a no-flag run, then the mean."""
    s = Source(name)
    cols = (("eval_return", ".1f", 1.0), ("wall_seconds", ".0f", 1.0), ("steps_per_second", ",.0f", 1.0),
            ("bytes_per_env_step", ".0f", 1.0), ("bytes", ".1f", 1e-6))
    rows = [[[str(r["seed"])], *[[s.num("runs", i, k, fmt=f, scale=sc)] for k, f, sc in cols]]
            for i, r in enumerate(s("runs"))]
    rows.append([["mean"], *[[s.num("mean", k, fmt=f, scale=sc)] for k, f, sc in cols[:4]], [DASH]])
    return [Table(["seed", "eval return", "wall s", "steps/s (training)", "bytes / env step", "MB"], rows, [s.name],
                  [s.command()], align="lrrrrr")]
