"""Structured pruning and knowledge distillation (AcceRL's Compressor stages) on real environment states."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch
from torch import nn

from frugalrl.compress.base import Artifact, CompressContext
from frugalrl.compress.chain import CompressorChain, count_params, policy_kl
from frugalrl.compress.distill import Distill, distill
from frugalrl.compress.prune import Prune, kept_units, n_kept, prune_agent
from frugalrl.evaluation import random_states
from frugalrl.nets import (
    MLPActorCritic,
    NatureCNNActorCritic,
    PolicySpec,
    action_desc,
    build_policy,
    make_agent,
)


def fit(
    agent: MLPActorCritic, obs: torch.Tensor, target: torch.Tensor, value: torch.Tensor, steps: int
) -> None:
    """Make a teacher non-trivial: regress its actor output (logits or mean) and value onto fixed targets."""
    opt = torch.optim.Adam(agent.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(obs.shape[0], (256,), generator=g)
        loss = (agent.actor(obs[idx]) - target[idx]).pow(2).mean() + (agent.value(obs[idx]) - value[idx]).pow(
            2
        ).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    agent.eval()


@pytest.fixture(scope="module")
def cartpole() -> tuple[MLPActorCritic, torch.Tensor, torch.Tensor]:
    """A CartPole teacher imitating the classic angle + angular-velocity controller, confidently."""
    env = gym.make("CartPole-v1")
    space = env.action_space
    obs = torch.as_tensor(random_states(env, 3000, seed=1), dtype=torch.float32)
    torch.manual_seed(0)
    teacher = MLPActorCritic(4, action_desc(space), (64, 64))
    score = obs[:, 2] + 0.5 * obs[:, 3]
    logits = torch.stack([-20 * score, 20 * score], dim=1).clamp(-4, 4)
    fit(teacher, obs[:2500], logits[:2500], 10 * obs[:2500, 2].abs() - obs[:2500, 0], steps=300)
    return teacher, obs[:2500], obs[2500:]


@pytest.fixture(scope="module")
def lander() -> tuple[MLPActorCritic, torch.Tensor, torch.Tensor]:
    """A continuous LunarLander teacher (Gaussian) with a fixed nonlinear mean and log-std -1."""
    env = gym.make("LunarLander-v3", continuous=True)
    space = env.action_space
    obs = torch.as_tensor(random_states(env, 3000, seed=2), dtype=torch.float32)
    torch.manual_seed(1)
    teacher = MLPActorCritic(8, action_desc(space), (64, 64))
    w = torch.randn(8, 2, generator=torch.Generator().manual_seed(3))
    mean = torch.tanh(obs @ w)
    fit(teacher, obs[:2500], mean[:2500], obs[:2500, 1] - obs[:2500, 0].abs(), steps=300)
    with torch.no_grad():
        teacher.log_std.fill_(-1.0)
    return teacher, obs[:2500], obs[2500:]


@pytest.fixture(scope="module")
def pong_frames() -> torch.Tensor:
    """200 real preprocessed Pong frames (4x84x84 uint8) from random play."""
    from frugalrl.envs.atari import make_atari

    return torch.as_tensor(random_states(make_atari("ALE/Pong-v5"), 200, seed=4))


def cnn_teacher(
    frames: torch.Tensor, channels: tuple[int, ...] = (32, 64, 64), hidden: int = 512
) -> nn.Module:
    """A Nature-CNN whose actor head is scaled up so its policy is far from uniform."""
    torch.manual_seed(5)
    net = NatureCNNActorCritic(list(frames.shape[1:]), {"type": "discrete", "n": 6}, channels, hidden)
    with torch.no_grad():
        net.actor.weight.mul_(300.0)
    return net.eval()


def masked_copy(agent: nn.Module, sparsity: float) -> nn.Module:
    """The original network with the pruned units' outputs forced to zero (rows and biases zeroed)."""
    masked = copy.deepcopy(agent)
    modules = dict(masked.named_modules())
    with torch.no_grad():
        for name, keep in kept_units(agent, sparsity).items():
            layer = modules[name]
            drop = torch.ones(layer.weight.shape[0], dtype=torch.bool)
            drop[keep] = False
            layer.weight[drop] = 0.0
            layer.bias[drop] = 0.0
    return masked


def assert_same_outputs(a: nn.Module, b: nn.Module, obs: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(a.dist_params(obs), b.dist_params(obs), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.value(obs), b.value(obs), atol=1e-5, rtol=1e-5)


# (a) exactness -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_fixture", ["cartpole", "lander"])
@pytest.mark.parametrize("sparsity", [0.3, 0.5, 0.9])
def test_pruned_mlp_equals_masked_original(
    env_fixture: str, sparsity: float, request: pytest.FixtureRequest
) -> None:
    teacher, _, held = request.getfixturevalue(env_fixture)
    pruned = prune_agent(teacher, sparsity)
    assert type(pruned) is type(teacher)
    assert_same_outputs(pruned, masked_copy(teacher, sparsity), held)
    if teacher.dist_kind == "gaussian":
        torch.testing.assert_close(pruned.log_std, teacher.log_std)
    # the kept units are those with the largest L1 norm of incoming weights
    for name, keep in kept_units(teacher, sparsity).items():
        norms = dict(teacher.named_modules())[name].weight.abs().sum(1)
        drop = torch.ones(len(norms), dtype=torch.bool)
        drop[keep] = False
        assert norms[keep].min() >= norms[drop].max()


def test_pruned_cnn_equals_masked_original(pong_frames: torch.Tensor) -> None:
    teacher = cnn_teacher(pong_frames)
    pruned = prune_agent(teacher, 0.5)
    assert pruned.channels == [16, 32, 32] and pruned.hidden == 256
    assert_same_outputs(pruned, masked_copy(teacher, 0.5), pong_frames)
    # and pruning really changes the policy (the test would be vacuous otherwise)
    assert float(policy_kl(teacher, pruned, pong_frames).mean()) > 1e-4


def test_pruned_grid_cnn_equals_masked_original() -> None:
    """The MinAtar paper's CNN (channels-last grids, one 3×3 convolution) prunes as the Nature-CNN does."""
    from frugalrl.envs.minatar import make_minatar

    env = make_minatar("breakout")
    grids = torch.as_tensor(random_states(env, 200, seed=2))
    torch.manual_seed(6)
    teacher = make_agent(env.observation_space, env.action_space).eval()
    assert isinstance(teacher, NatureCNNActorCritic) and teacher.channels_last
    with torch.no_grad():
        teacher.actor.weight.mul_(300.0)
    pruned = prune_agent(teacher, 0.5)
    assert pruned.channels == [8] and pruned.hidden == 64 and pruned.convs == teacher.convs and pruned.channels_last
    assert_same_outputs(pruned, masked_copy(teacher, 0.5), grids)
    assert float(policy_kl(teacher, pruned, grids).mean()) > 1e-4
    rebuilt = build_policy(pruned.spec.to_json())
    rebuilt.load_state_dict(pruned.state_dict())
    assert_same_outputs(rebuilt, pruned, grids)


def test_prune_zero_sparsity_is_identity(cartpole: tuple, pong_frames: torch.Tensor) -> None:
    teacher, _, held = cartpole
    assert_same_outputs(prune_agent(teacher, 0.0), teacher, held)
    cnn = cnn_teacher(pong_frames, (8, 16), 32)
    assert_same_outputs(prune_agent(cnn, 0.0), cnn, pong_frames[:16])


# (b) shapes, parameter counts, rebuild from spec -----------------------------------------------------------


def test_prune_shrinks_and_rebuilds_from_spec(cartpole: tuple, pong_frames: torch.Tensor) -> None:
    teacher, _, held = cartpole
    before = [p.detach().clone() for p in teacher.parameters()]
    pruned = prune_agent(teacher, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(before, teacher.parameters(), strict=True))  # untouched
    assert pruned.hidden == [32, 32] and pruned.spec.kwargs["hidden"] == [32, 32]
    assert pruned.actor[2].weight.shape == (32, 32) and pruned.critic[2].weight.shape == (32, 32)
    inner = pruned.actor[2].weight.numel() / teacher.actor[2].weight.numel()
    assert inner == pytest.approx(0.25)
    ratio = count_params(pruned) / count_params(teacher)
    assert 0.25 <= ratio < 0.35, ratio

    for agent, obs in ((pruned, held), (prune_agent(cnn_teacher(pong_frames), 0.5), pong_frames[:8])):
        rebuilt = build_policy(agent.spec.to_json())
        assert [p.shape for p in rebuilt.parameters()] == [p.shape for p in agent.parameters()]
        rebuilt.load_state_dict(agent.state_dict())
        assert_same_outputs(rebuilt, agent, obs)

    cnn = cnn_teacher(pong_frames)
    small = prune_agent(cnn, 0.75)
    assert small.channels == [n_kept(c, 0.75) for c in (32, 64, 64)] == [8, 16, 16]
    assert small.trunk[2].weight.shape == (16, 8, 4, 4)
    assert small.trunk[7].weight.shape == (128, 16 * 7 * 7)
    assert count_params(small) < 0.1 * count_params(cnn)


def test_prune_stage_describe_and_artifact(cartpole: tuple) -> None:
    teacher, train, _ = cartpole
    stage = Prune(0.5)
    assert stage.describe() == "prune:0.5"
    art = stage.apply(Artifact(teacher), CompressContext(teacher, train))
    assert art.onnx is None and art.precision == "fp32" and art.module.hidden == [32, 32]
    assert n_kept(1, 0.9) == 1 and n_kept(64, 0.0) == 64


# (c) distillation repairs a pruned network ------------------------------------------------------------------


@pytest.mark.parametrize("env_fixture,bound", [("cartpole", 0.02), ("lander", 0.05)])
def test_distill_after_prune_reduces_kl(
    env_fixture: str, bound: float, request: pytest.FixtureRequest
) -> None:
    teacher, train, held = request.getfixturevalue(env_fixture)
    ctx = CompressContext(teacher, train, seed=0)
    pruned_art = Prune(0.75).apply(Artifact(teacher), ctx)
    pruned_params = [p.detach().clone() for p in pruned_art.module.parameters()]
    stage = Distill(steps=250)
    art = stage.apply(pruned_art, ctx)
    kl_pruned = float(policy_kl(teacher, pruned_art.module, held).mean())
    kl_distilled = float(policy_kl(teacher, art.module, held).mean())
    print(
        f"{env_fixture}: held-out KL pruned={kl_pruned:.4f} distilled={kl_distilled:.4f} stats={stage.last_stats}"
    )
    assert kl_distilled < bound
    assert kl_distilled < 0.5 * kl_pruned
    assert stage.last_stats["last_loss"] < stage.last_stats["first_loss"]
    # neither the incoming network nor the teacher changed; the result has the pruned shape
    assert all(torch.equal(a, b) for a, b in zip(pruned_params, pruned_art.module.parameters(), strict=True))
    assert [p.shape for p in art.module.parameters()] == [p.shape for p in pruned_art.module.parameters()]
    assert art.onnx is None and art.precision == "fp32"


def test_distill_stops_at_its_tolerance_and_warm_starts_from_the_previous_student(cartpole: tuple) -> None:
    """IMPALA's rebuilds: ``kl_tol`` ends a distillation early once the student matches; ``warm_start`` begins
    the next from the last student, which follows a teacher that moved a little in far fewer steps."""
    teacher, train, held = cartpole
    ctx = CompressContext(teacher, train, seed=0)
    pruned = Prune(0.5).apply(Artifact(teacher), ctx)
    full = Distill(steps=400, beta=0.0)
    full.apply(pruned, ctx)
    stage = Distill(steps=400, beta=0.0, kl_tol=2 * full.last_stats["kl_mean"] + 1e-4, warm_start=True)
    first = stage.apply(pruned, ctx)
    assert stage.last_stats["steps"] < 400 and stage.last_stats["steps"] % 25 == 0
    moved = copy.deepcopy(teacher)
    with torch.no_grad():
        for prm in moved.parameters():
            prm.mul_(1.02)
    ctx2 = CompressContext(moved, train, seed=1)
    cold = Distill(steps=400, beta=0.0, kl_tol=stage.kl_tol)
    cold.apply(Prune(0.5).apply(Artifact(moved), ctx2), ctx2)
    second = stage.apply(Prune(0.5).apply(Artifact(moved), ctx2), ctx2)
    assert stage.last_stats["steps"] < cold.last_stats["steps"]
    assert second.module is not first.module and float(policy_kl(moved, second.module, held).mean()) < 0.05


# (d) distillation into a fresh smaller student -------------------------------------------------------------


def test_distill_fresh_small_mlp_student(cartpole: tuple) -> None:
    teacher, train, held = cartpole
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    stage = Distill(student={"hidden": [32, 32]}, steps=300)
    art = stage.apply(Artifact(teacher), CompressContext(teacher, train, seed=3))
    assert art.module.hidden == [32, 32] and art.module.spec.kwargs["hidden"] == [32, 32]
    kl = float(policy_kl(teacher, art.module, held).mean())
    print(f"fresh MLP student: held-out KL={kl:.4f} stats={stage.last_stats}")
    assert kl < 0.03
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    # reproducible for a given seed
    again = Distill(student={"hidden": [32, 32]}, steps=300).apply(
        Artifact(teacher), CompressContext(teacher, train, 3)
    )
    assert all(
        torch.equal(a, b) for a, b in zip(art.module.parameters(), again.module.parameters(), strict=True)
    )


def test_distill_fresh_small_cnn_student_on_pong_frames(pong_frames: torch.Tensor) -> None:
    teacher = cnn_teacher(pong_frames, (16, 32), 128)
    train, held = pong_frames[:160], pong_frames[160:]
    small = build_policy(
        PolicySpec(teacher.spec.factory, {**teacher.spec.kwargs, "channels": [8, 16], "hidden": 64})
    )
    stats = distill(teacher, small, train, steps=3, batch_size=8)  # the plain function, on uint8 frames
    assert set(stats) >= {"first_loss", "last_loss", "kl_mean", "kl_max"}
    stage = Distill(student={"channels": [8, 16], "hidden": 64}, steps=150, batch_size=32, lr=3e-3)
    art = stage.apply(Artifact(teacher), CompressContext(teacher, train, seed=0))
    assert art.module.channels == [8, 16] and art.module.hidden == 64
    kl_init = float(policy_kl(teacher, build_policy(art.module.spec), held).mean())
    kl = float(policy_kl(teacher, art.module, held).mean())
    print(f"fresh CNN student: held-out KL init={kl_init:.4f} distilled={kl:.4f} stats={stage.last_stats}")
    assert kl < 0.2 and kl < 0.5 * kl_init


def test_prune_then_distill_cnn_on_pong_frames(pong_frames: torch.Tensor) -> None:
    teacher = cnn_teacher(pong_frames, (16, 32), 128)
    train, held = pong_frames[:160], pong_frames[160:]
    ctx = CompressContext(teacher, train, seed=0)
    pruned = Prune(0.5).apply(Artifact(teacher), ctx).module
    art = Distill(steps=100, batch_size=32, lr=3e-3).apply(Artifact(pruned), ctx)
    kl_pruned = float(policy_kl(teacher, pruned, held).mean())
    kl = float(policy_kl(teacher, art.module, held).mean())
    print(f"pruned CNN: held-out KL pruned={kl_pruned:.4f} distilled={kl:.4f}")
    assert art.module.channels == [8, 16] and art.module.hidden == 64
    assert kl < 0.05 and kl < 0.5 * kl_pruned


# (e) errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, float("nan"), "0.5", True])
def test_bad_sparsity(bad: object, cartpole: tuple) -> None:
    with pytest.raises(ValueError, match="sparsity"):
        Prune(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sparsity"):
        prune_agent(cartpole[0], bad)  # type: ignore[arg-type]


def test_unsupported_module_and_bad_distill_options(cartpole: tuple) -> None:
    teacher, train, _ = cartpole
    with pytest.raises(TypeError, match="MLPActorCritic.*NatureCNNActorCritic"):
        prune_agent(nn.Linear(4, 2), 0.5)
    with pytest.raises(ValueError, match="steps"):
        Distill(steps=0)
    with pytest.raises(ValueError, match="lr"):
        Distill(lr=0.0)
    with pytest.raises(TypeError, match="student"):
        Distill(student=[32, 32])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bogus"):
        Distill(student={"bogus": 1}, steps=5).apply(Artifact(teacher), CompressContext(teacher, train))
    other = MLPActorCritic(4, {"type": "discrete", "n": 3}, (8,))
    with pytest.raises(ValueError, match="action heads differ"):
        distill(teacher, other, train, steps=1)


# (f) the chain -------------------------------------------------------------------------------------------


def test_chain_prune_then_distill(lander: tuple) -> None:
    teacher, train, held = lander
    chain = CompressorChain(batch_sizes=(1,)).add(Prune(0.5)).add(Distill(steps=200))
    assert chain.describe() == "prune:0.5,distill:200"
    actor = chain.build(teacher, train.numpy(), seed=1)
    names = [r.stage for r in chain.reports]
    assert names == ["original", "prune:0.5", "distill:200"]
    original, pruned, distilled = chain.reports
    assert original.params > pruned.params == distilled.params
    assert pruned.wire_bytes < original.wire_bytes
    assert original.kl_mean == pytest.approx(0.0, abs=1e-6)
    assert distilled.kl_mean < pruned.kl_mean
    print(
        f"chain: KL pruned={pruned.kl_mean:.4f} distilled={distilled.kl_mean:.4f} params {original.params}->{distilled.params}"
    )
    assert isinstance(actor, MLPActorCritic) and actor.hidden == [32, 32]
    assert float(policy_kl(teacher, actor, held).mean()) < 0.05
