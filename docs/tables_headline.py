"""The headline table (README and the docs' landing page): one row per claim, each read from the JSON that
``benchmarks/headline.py`` (``make headline``) wrote for it on one commit, with a link to it and to the docs page
that explains it. Split from ``docs/gen_tables.py``, which registers it as the ``headline`` bench."""

from __future__ import annotations

from table_model import RESULTS, RESULTS_URL, Cell, Num, Source, Table, pm

ROWS = ("ppo", "ppo-bytes", "dropin", "compress", "accerl", "pipeline", "lda", "hsa2c", "a2c", "link")
"""README order; ``ppo-bytes`` is a second claim read from the ``ppo`` row's runs."""
PAGES = {"ppo": "benchmarks.md", "ppo-bytes": "clusterenv.md", "dropin": "benchmarks.md", "compress": "accerl.md",
         "accerl": "accerl.md", "pipeline": "pipeline.md", "lda": "dpsgd.md", "hsa2c": "dpsgd.md",
         "a2c": "benchmarks.md", "link": "dpsgd.md"}


def headline_sources() -> list[Source]:
    """The headline rows' JSONs that exist (``results/headline/<row>.json``)."""
    return [Source(f"headline/{p.stem}") for p in sorted((RESULTS / "headline").glob("*.json"))
            if not p.stem.endswith("-raw") and "-raw-" not in p.stem]


def _steps(n: float) -> str:
    """2000000 → "2M", 200000 → "200k"."""
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def _x(s: Source, *path: str | int, fmt: str = ".2f") -> Num:
    return s.num("summary", *path, fmt=fmt, suffix="×")


def _ret(s: Source, *path: str) -> Cell:
    """``mean ± sample std`` of a ``{"mean", "std"}`` summary entry."""
    return pm(s, ("summary", *path, "mean"), ("summary", *path, "std"))


def _seeds(s: Source, *path: str) -> str:
    """``"3 seeds (101–103)"`` from a summary entry's ``per_seed`` list (seeds run from 101)."""
    n = len(s("summary", *path, "per_seed"))
    return f"{n} seed{'s' if n > 1 else ''} (101{f'–{100 + n}' if n > 1 else ''})"


def row_cells(key: str, s: Source) -> tuple[Cell, Cell]:
    """The claim and the result of one headline row."""
    m = s("summary")
    if key == "ppo":
        f, r = "frugal-aaps-bf16", "sb3-zoo"
        return ([f"PPO, AAPS δ = 0.05 + bf16 delta-coded weights, vs Stable-Baselines3 PPO (rl-zoo's entry, its "
                 f"budget), LunarLander-v3, {_steps(m['steps'])} steps, {_seeds(s, f, 'return')}"],
                ["return ", *_ret(s, f, "return"), " vs ", *_ret(s, r, "return"), " in ", _x(s, "wall_vs_sb3"),
                 " the wall time with start-up (", s.num("summary", f, "process_wall_s", fmt=".0f", suffix=" s"), " vs ",
                 s.num("summary", r, "process_wall_s", fmt=".0f", suffix=" s"), ")"])
    if key == "ppo-bytes":
        f, e = "frugal-aaps-bf16", "frugal-every-fp32"
        return (["The same PPO runs: AAPS + bf16 + deltas vs fp32 weights after every update; the experience "
                 "uplink (lossless default)"],
                [_x(s, "weight_bytes_fewer", fmt=".1f"), " fewer weight bytes (",
                 s.num("summary", f, "weight_bytes_per_step", fmt=".2f"), " vs ",
                 s.num("summary", e, "weight_bytes_per_step", fmt=".1f"), " B per env step), return ",
                 *_ret(s, f, "return"), " vs ", *_ret(s, e, "return"), "; uplink ",
                 s.num("summary", f, "uplink_bytes_per_step", fmt=".1f"), " B per env step"])
    if key == "dropin":
        ll, cp = "LunarLander-v3", "CartPole-v1"
        claim: Cell = ["ClusterEnv vs Gymnasium's SyncVectorEnv, 16 envs on 2 workers (2 cores: one inline in the head), "
                       "same policy loop; AsyncVectorEnv with the same 8 envs per process for scale"]
        res: Cell = []
        for env in (ll, cp):
            if env in m:
                res += [f"{env.split('-')[0]}: `step()` ", _x(s, env, "vs_sync", "step"), ", `rollout()` ",
                        _x(s, env, "vs_sync", "rollout"), ", Async ", _x(s, env, "vs_sync", "async"), " the env steps/s; "]
        if "cleanrl_ppo" in m:
            res += ["CleanRL's ppo.py (CartPole, 4 envs): ", _x(s, "cleanrl_ppo", "time_ratio"),
                    " SyncVectorEnv's wall time, return ", s.num("summary", "cleanrl_ppo", "clusterenv_return"), " vs ",
                    s.num("summary", "cleanrl_ppo", "sync_return")]
        return claim, res
    if key == "compress":
        return (["AcceRL compressor chain (prune, distill, int8, ONNX), Nature-CNN on Pong frames"],
                [_x(s, "speedup_batch1"), " faster per state at batch 1 (", _x(s, "speedup_batch16"),
                 " at 16), weights ", _x(s, "weights_smaller", fmt=".0f"), " smaller"])
    if key == "accerl":
        res = []
        for env in m:
            res += [f"{env} ({_steps(m[env]['steps'])}): ", *_ret(s, env, "full"), " vs copy ", *_ret(s, env, "copy"),
                    ", ", _x(s, env, "weight_bytes_fewer_than_every_copy", fmt=".1f"), " fewer weight bytes, ",
                    _x(s, env, "wall_vs_copy"), " the wall time; "]
        return (["IMPALA with AcceRL actors `prune:0.5,distill,int8,onnx` vs exact learner copies (AAPS on for both), "
                 f"{_seeds(s, next(iter(m)), 'full')}"], res)
    if key == "pipeline":
        return ([f"Split-model PPO, CartPole-v1, {_steps(m['steps'])} steps, {_seeds(s, 'dense')}: p = 0.99 sparse cut "
                 "gradients vs dense"],
                ["return ", *_ret(s, "p0.99"), " vs ", *_ret(s, "dense"), ", gradient bytes ",
                 _x(s, "gradients_vs_dense", fmt=".3f"), " (dense warm start included)"])
    if key == "lda":
        return (["DPSVI (LDA on DPSGD, its defaults) vs gensim LdaMulticore, 100k synthetic documents, V = 50,000: "
                 f"seconds to gensim's target perplexity, mean of {len(m['seeds'])} corpus seeds"],
                [s.num("summary", "dpsvi_with_startup_s_mean", fmt=".2f", suffix=" s"), " with its worker start-up (",
                 s.num("summary", "dpsvi_s_mean", fmt=".2f", suffix=" s"), " without) vs gensim ",
                 s.num("summary", "gensim-w1_s_mean", fmt=".2f", suffix=" s"), " (1 worker) / ",
                 s.num("summary", "gensim-w2_s_mean", fmt=".2f", suffix=" s"), " (2), its pool start-up included"])
    if key in ("hsa2c", "link"):
        h, a = m["hsa2c"], m["a3c"]
        where = "one machine" if key == "hsa2c" else "workers across a 50 Mbit/s link"
        res = [f"{h['reached']} and {a['reached']} seeds reach 200; time with every seed counted (an unreached one "
               "at its whole time) ", s.num("summary", "hsa2c", "time_every_seed_s", fmt=".1f",
                                            prefix="≥ " if h["lower_bound"] else "", suffix=" s"),
               " vs ", s.num("summary", "a3c", "time_every_seed_s", fmt=".1f", prefix="≥ " if a["lower_bound"] else "",
                             suffix=" s"),
               "; final return ", *_ret(s, "hsa2c", "final"), " vs ", *_ret(s, "a3c", "final")]
        if h.get("mb_to_target") and a.get("mb_to_target"):
            res += ["; ", s.num("summary", "hsa2c", "mb_to_target", fmt=".0f"), " vs ",
                    s.num("summary", "a3c", "mb_to_target", fmt=".0f"), " MB to 200 (seeds that reached it)"]
        return ([f"HSA2C (B = 10) vs DDRL A3C (B = 1), the same recipe, LunarLander-v3, {where}, "
                 f"{_steps(h['steps'])} steps or {h['time_limit_s']:.0f} s, {_seeds(s, 'hsa2c', 'final')}"], res)
    if key == "a2c":
        res = []
        for b in sorted(m, key=lambda b: m[b]["steps"]):
            res += [f"{_steps(m[b]['steps'])}, {_seeds(s, b, 'hsa2c', 'return')}: HSA2C ", *_ret(s, b, "hsa2c", "return"), ", A3C ",
                    *_ret(s, b, "a3c", "return"), ", SB3 ", *_ret(s, b, "sb3-zoo", "return"), ", HSA2C's wall time ",
                    _x(s, b, "wall_vs_sb3"), " SB3's; "]
        return (["HSA2C (B = 10) and DDRL A3C (the same recipe) vs Stable-Baselines3 A2C (rl-zoo), LunarLander-v3, at "
                 "rl-zoo's budget (200k) and at 1M"], res)
    raise KeyError(key)


def t_headline(where: str) -> list[Table]:
    """The headline table: one claim per row, each with its JSON and its docs page. ``where``: ``readme``
    (links from the repository's root) or ``site`` (links inside the docs)."""
    found = {s.name.removeprefix("headline/").removesuffix(".json"): s for s in headline_sources()}
    rows: list[list[Cell]] = []
    for key in ROWS:
        s = found.get(key.removesuffix("-bytes"))
        if s is None:
            continue
        page = PAGES[key]
        link: Cell = ([f"[`{s.name}`](benchmarks/results/{s.name}) · [docs](docs/{page})"] if where == "readme"
                      else [f"[`{s.name}`]({RESULTS_URL}/{s.name}) · [{page[:-3]}]({page})"])
        if s.get("skipped"):
            rows.append([[s("claim")], [f"not measured on this machine: {s('skipped')}"], link])
            continue
        claim, result = row_cells(key, s)
        notes = [f"{what}: {s(field)}" for what, field in (("trimmed", "trims"), ("not shown", "does_not_show"))
                 if s.get(field) and key != "ppo-bytes"]
        if notes:
            claim = [*claim, f" ({'; '.join(notes)})"]
        if s.get("budget") == "quick":
            result = ["(quick budget, a smoke run) ", *result]
        rows.append([claim, [*result[:-1], str(result[-1]).removesuffix("; ")] if isinstance(result[-1], str)
                     else result, link])
    return [Table(["claim (frugalrl vs the reference)", "result", "data"], rows)]
