"""AcceRL's Code 1-3 with frugalrl: compressed actors, corrected learner, monitored compression.

    python examples/accerl_compressed_actors.py              # 300 updates
    python examples/accerl_compressed_actors.py --updates 20

A hand-written loop (``frugalrl train impala`` is the full version): actors on 2 worker processes run
an int8 ONNX graph of the learner's policy, rebuilt every 10 updates; V-trace corrects the data; the
Monitor moves int8 → fp16 → fp32 if the actors' policy drifts too far from the learner's.
"""

import argparse

import torch

from frugalrl import AAPS, ClusterEnv, make_agent
from frugalrl.algos.impala import IMPALAConfig, impala_update
from frugalrl.compress import CompressorChain, Export, Quantize
from frugalrl.correct import CorrectorChain, VTraceCorrector
from frugalrl.monitor import Monitor, PrecisionLadder

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=300, help="learner updates (20 env steps × 8 envs each)")
    args = parser.parse_args()
    envs = ClusterEnv("CartPole-v1", num_workers=2, envs_per_worker=4, backend="local", sync=AAPS(0.01), seed=1)
    learner = make_agent(envs.single_observation_space, envs.single_action_space)
    optimizer = torch.optim.Adam(learner.parameters(), lr=5e-4, eps=1e-5)
    cfg = IMPALAConfig(gamma=0.99, ent_coef=0.01, vf_coef=0.5)
    generator = torch.Generator().manual_seed(1)

    # Code 1: the chain of compressors; Code 2: the chain of correctors; Code 3: a monitor with a strategy.
    chain = CompressorChain().add(Quantize("int8")).add(Export("onnx"))
    correctors = CorrectorChain().add(VTraceCorrector(rho_bar=1.0, c_bar=1.0))
    monitor = Monitor([PrecisionLadder(epsilon=0.05, current="int8")])

    obs, _ = envs.reset(seed=1)
    states = torch.as_tensor(obs)
    actor = chain.build(learner, states)
    returns: list[float] = []
    for update in range(1, args.updates + 1):
        batch = envs.rollout(actor, num_steps=20)  # workers act with the int8 graph
        states = torch.as_tensor(batch.obs).reshape(-1, *batch.obs.shape[2:])
        stats = impala_update(learner, optimizer, batch, correctors, cfg, generator)  # V-trace, then clipped epochs
        returns = (returns + list(batch.episode_returns))[-20:]
        if update % 10 == 0:
            changes = monitor.observe(update, learner, actor, states, batch.episode_returns)
            chain.configure(precision=changes.get("precision"))
            actor = chain.build(learner, states)  # AAPS decides whether the workers need it
        if update % 50 == 0:
            mean = sum(returns) / max(1, len(returns))
            print(f"update {update}: return {mean:.1f}, syncs {envs.stats()['weight_syncs']['total']}, "
                  f"KL max {monitor.latest().get('kl_max', 0):.4f}, precision {actor.precision}")
    for r in chain.reports:
        print(f"{r.stage:>8}: {r.params} params, {r.wire_bytes} bytes, {r.latency_ms} ms, KL {r.kl_mean:.1e}")
    print("bytes by kind:", {k: v for k, v in envs.stats()["bytes"].items() if isinstance(v, int)})
    envs.close()
