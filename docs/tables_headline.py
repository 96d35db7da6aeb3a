"""The headline table (README and the docs' landing page): one result per system, each read from its JSON, with
a link to it and to the docs page that explains it. Split from ``docs/gen_tables.py``, which registers it as the
``headline`` bench."""

from __future__ import annotations

from table_model import RESULTS_URL, Cell, Num, Source, Table, cross, pm
from tables_dpsgd import method_path

M05 = "its defaults with master momentum 0.5 and a constant η"
"""How rows measured before 2026-11-27, when HSA2C's master momentum defaulted to 0.5 (ρ 0.5) and its rate was
constant, name their setting."""


def _steps(n: int) -> str:
    """2000000 → "2M", 200000 → "200k"."""
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def t_headline(where: str) -> list[Table]:
    """The headline table: one result per system, each with its JSON and its docs page. ``where``: ``readme``
    (links from the repository's root) or ``site`` (links inside the docs)."""
    ls, up, a3, t6 = Source("learning_suite"), Source("uplink"), Source("aaps_3seeds"), Source("compress_table6")
    pc, psa, ps = Source("pipeline_carracing"), Source("pipeline_carracing_sa"), Source("pipeline_suite")
    lda, hs, tp = Source("lda_baselines_large_seed0_bf16"), Source("hsa2c_sweep/anneal50_vs_a3c_seeds1_10"), Source("dropin_speed")
    ar, am, hm = Source("a2c_reference_1m_cool50"), Source("a2c_reference_minatar"), Source("hsa2c_vs_sync_minatar_cnn")
    alc, aho = Source("a2c_reference_lunar_continuous_sde2"), Source("a2c_reference_hopper_sde2")
    hl = Source("hsa2c_link_cool50_3m_50mbit")
    dl = ("rows", next(i for i, r in enumerate(tp("rows")) if r["env"] == "LunarLander-v3" and r["workers"] == 2))
    ll = ("table", "LunarLander-v3", "variants")
    chain = len(t6("rows")) - 1
    w1, g1 = method_path(lda, "dpsvi-w1p1"), method_path(lda, "gensim-w1")
    assert w1 and g1
    def vs_a3c(s: Source, target: float, what: str) -> list[list[Cell]]:
        """A ``hsa2c_vs_sync`` file's HSA2C and DDRL A3C rows at ``target``: seeds reached, mean time, MB."""
        h, a = (next(i for i, r in enumerate(s("rows")) if r["variant"].startswith(v) and r["target"] == target)
                for v in ("HSA2C", "DDRL"))
        return [[f"HSA2C (B = 10) vs DDRL A3C (B = 1), {what}, {len(s('rows', h, 'times'))} seeds"],
                [s("rows", h, "time_to_target", "reached"), " and ", s("rows", a, "time_to_target", "reached"),
                 f" seeds reach {target:g}, in ", s.num("rows", h, "time_to_target", "mean", suffix=" s"), " vs ",
                 s.num("rows", a, "time_to_target", "mean", suffix=" s"), *all_seeds(s, h, a), ", with ",
                 s.num("rows", h, "mb_to_target", fmt=".0f"), " vs ", s.num("rows", a, "mb_to_target", fmt=".0f"), " MB"],
                link(s, "dpsgd.md")]

    def all_seeds(s: Source, h: int, a: int) -> Cell:
        """When a seed missed the target: both means with every seed counted (an unreached one at its whole time)."""
        def every_seed_reached(i: int) -> bool:
            reached, seeds = s("rows", i, "time_to_target", "reached").split("/")
            return bool(reached == seeds)

        if every_seed_reached(h) and every_seed_reached(a):
            return []

        def mean(i: int) -> Num:
            bound = "≥ " if s("rows", i, "time_to_target", "all_lower_bound") else ""
            return s.num("rows", i, "time_to_target", "all_mean", prefix=bound, suffix=" s")
        return [" (every seed, an unreached one at its whole training time: ", mean(h), " vs ", mean(a), ")"]

    def vs_sb3(s: Source, what: str, defaults: str = M05) -> list[list[Cell]]:
        """An ``a2c_reference`` file's HSA2C and SB3 rows: final returns and the training-time ratio."""
        h, r = (next(("rows", i) for i, x in enumerate(s("rows")) if x["variant"] == v) for v in ("hsa2c", "sb3-zoo"))
        return [[f"HSA2C (B = 10, {defaults}) vs Stable-Baselines3 A2C (rl-zoo), {what}, "
                 f"{_steps(s('steps'))} steps, {len(s(*h, 'finals'))} seeds"],
                ["return ", *pm(s, (*h, "mean"), (*h, "std")), " vs ", *pm(s, (*r, "mean"), (*r, "std")), " in ",
                 cross(s, (*h, "train_s_mean"), s, (*r, "train_s_mean"), ".2f", suffix="×"), " the training time"],
                link(s, "benchmarks.md")]

    def link(s: Source, page: str) -> Cell:
        if where == "readme":
            return [f"[`{s.name}`](benchmarks/results/{s.name}) · [docs](docs/{page})"]
        return [f"[`{s.name}`]({RESULTS_URL}/{s.name}) · [{page[:-3]}]({page})"]

    rows: list[list[Cell]] = [
        [["PPO + AAPS + bf16 weights vs Stable-Baselines3 (rl-zoo), LunarLander-v3, 1M steps, 3 seeds"],
         ["return ", *pm(ls, (*ll, "frugal-aaps-bf16", "final_return_mean"), (*ll, "frugal-aaps-bf16", "final_return_std")),
          " vs ", *pm(ls, (*ll, "sb3-zoo", "final_return_mean"), (*ll, "sb3-zoo", "final_return_std")), " in ",
          ls.num(*ll, "frugal-aaps-bf16", "wall_vs_sb3", fmt=".2f", suffix="×"), " the wall time"],
         link(ls, "benchmarks.md")],
        [["AAPS δ = 0.05 vs weights after every update, LunarLander-v3, 3 seeds"],
         [a3.num("rows", 1, "weight_bytes_ratio_vs_every", suffix="×"), " fewer weight bytes, return ",
          a3.num("rows", 1, "final_eval_return"), " vs ", a3.num("rows", 0, "final_eval_return")],
         link(a3, "clusterenv.md")],
        [["Experience uplink (defaults: log-probabilities + zstd; lossy int8 observations on request), "
          "LunarLander-v3 PPO + AAPS"],
         [up.num("settings", "raw", "bytes_per_step", "total", fmt=".1f"), " → ",
          up.num("settings", "auto", "bytes_per_step", "total", fmt=".1f"), " (lossless) / ",
          up.num("settings", "int8", "bytes_per_step", "total", fmt=".1f"), " (int8) bytes per env step; return ",
          up.num("settings", "raw", "eval_return_mean"), " / ", up.num("settings", "auto", "eval_return_mean"), " / ",
          up.num("settings", "int8", "eval_return_mean")],
         link(up, "clusterenv.md")],
        [["AcceRL compressor chain (prune, distill, int8, ONNX), Nature-CNN on Pong frames"],
         [t6.num("rows", chain, "speedup_vs_torch_fp32_original", "1", fmt=".2f", suffix="×"),
          " faster per state (batch 1), weights ",
          t6.agg("ratio", [("rows", 0, "wire_bytes"), ("rows", chain, "wire_bytes")], ".0f", suffix="×"), " smaller"],
         link(t6, "accerl.md")],
        [["AcceRL actors `prune:0.5,distill,int8,onnx` vs learner copies every update, LunarLander-v3"],
         ["return ", *pm(ls, (*ll, "impala-full", "final_return_mean"), (*ll, "impala-full", "final_return_std")),
          " (copy ", ls.num(*ll, "impala-copy", "final_return_mean"), "), ",
          ls.num(*ll, "impala-full", "weight_bytes_fewer_than_every_copy", suffix="×"), " fewer weight bytes"],
         link(ls, "accerl.md")],
        [["Split-model PPO, CarRacing-v3: sparse cut gradients (p = 0.99) + sparse activations"],
         [cross(psa, ("table", "p0.99-sa", "total_bytes"), pc, ("table", "dense", "total_bytes"), ".3f", suffix="×"),
          " the total traffic of dense cut gradients (1 seed, 20k steps)"],
         link(psa, "pipeline.md")],
        [["Split-model PPO, CartPole-v1, 3 seeds: p = 0.99 cut gradients vs dense"],
         ["return ", ps.num("table", "CartPole-v1", "variants", "p0.99", "return_gap_vs_base", fmt="+.1%"),
          ", gradient bytes ", ps.num("table", "CartPole-v1", "variants", "p0.99", "gradients_vs_base", fmt=".3f", suffix="×"),
          " (dense warm start included)"],
         link(ps, "pipeline.md")],
        [["DPSVI (LDA on DPSGD, its defaults: seeded start, bf16 pushes), 100k documents, V = 50,000: time to gensim's target perplexity"],
         [lda.num(*w1, "time_to_target_s", fmt=".2f", suffix=" s"), " vs gensim ",
          lda.num(*g1, "time_to_target_s", fmt=".2f", suffix=" s")],
         link(lda, "dpsgd.md")],
        vs_a3c(hs, 200, "LunarLander-v3, HSA2C's defaults, one machine"),
        vs_a3c(hl, 200, "LunarLander-v3, HSA2C's defaults, workers across a 50 Mbit/s link, 3M steps"),
        vs_a3c(hm, 10, f"MinAtar Breakout, grid CNN, {M05}"),
        vs_sb3(ar, "LunarLander-v3", "its defaults"),
        vs_sb3(am, "MinAtar Breakout (atari recipe, same CNN)"),
        vs_sb3(alc, "LunarLanderContinuous-v3", f"{M05}, gSDE exploration"),
        vs_sb3(aho, "MuJoCo Hopper-v5 (short of SB3)", f"{M05}, gSDE exploration"),
        [["ClusterEnv `step()` (the drop-in path) vs Gymnasium's SyncVectorEnv, LunarLander-v3, 16 envs on 2 workers "
          "(2 cores: one inline in the head), same policy loop (AsyncVectorEnv with 8 envs per process: ", tp.num(*dl, "vs_sync", "async", fmt=".2f",
                                                                             suffix="×"), ")"],
         [tp.num(*dl, "vs_sync", "step", fmt=".2f", suffix="×"), " the env steps/s; `send`/`recv` ",
          tp.num(*dl, "vs_sync", "pool", fmt=".2f", suffix="×"), ", `rollout()` ",
          tp.num(*dl, "vs_sync", "rollout", fmt=".2f", suffix="×")],
         link(tp, "benchmarks.md")],
    ]
    return [Table(["system, setting", "result", "data"], rows)]
