"""ONNX export, post-training quantization and the OnnxPolicy actor (AcceRL's Quantize/Export stages).

Everything runs on real states: CartPole observations and preprocessed Pong frames (4x84x84 uint8).
"""

from __future__ import annotations

import copy
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from frugalrl import ClusterEnv
from frugalrl.compress.base import Artifact, CompressContext
from frugalrl.compress.chain import CompressorChain, policy_kl, wire_bytes
from frugalrl.compress.export import Export, export_onnx
from frugalrl.compress.quantize import Quantize, quantize_int8, to_fp16
from frugalrl.compress.runtime import OnnxPolicy
from frugalrl.evaluation import random_states
from frugalrl.nets import MLPActorCritic, NatureCNNActorCritic, PolicySpec, action_desc, build_policy
from frugalrl.wire.message import decode_message, decode_state_dict, encode_message, encode_state_dict

HEAD_SCALE = 1000.0  # scales the actor head: a random-init head gives near-uniform (trivial) policies


def sharpen(agent: nn.Module, scale: float) -> nn.Module:
    """Scale the last layer of the actor head so the policy is far from uniform."""
    head = agent.actor[-1] if isinstance(agent.actor, nn.Sequential) else agent.actor
    with torch.no_grad():
        head.weight.mul_(scale)
    return agent.eval()


@pytest.fixture(scope="module")
def pong() -> tuple[NatureCNNActorCritic, torch.Tensor]:
    """A Nature-CNN with a sharpened head and 48 real Pong frames."""
    from frugalrl.envs.atari import make_atari

    env = make_atari("ALE/Pong-v5")
    frames = torch.from_numpy(random_states(env, 48, seed=1))
    torch.manual_seed(0)
    net = NatureCNNActorCritic(env.observation_space.shape, action_desc(env.action_space))
    return sharpen(net, HEAD_SCALE), frames


@pytest.fixture(scope="module")
def cartpole() -> tuple[MLPActorCritic, torch.Tensor]:
    """An MLP agent with a sharpened head and 64 real CartPole states."""
    env = gym.make("CartPole-v1")
    states = torch.from_numpy(random_states(env, 64, seed=2))
    torch.manual_seed(0)
    return sharpen(MLPActorCritic(4, {"type": "discrete", "n": 2}), 100.0), states


@pytest.fixture(scope="module")
def pong_graphs(pong: tuple[nn.Module, torch.Tensor]) -> dict[str, bytes]:
    """fp32, int8 and fp16 graphs of the Pong network."""
    net, frames = pong
    fp32 = export_onnx(net, frames[:8])
    return {"fp32": fp32, "int8": quantize_int8(fp32, frames), "fp16": to_fp16(fp32)}


def entropy(params: torch.Tensor) -> float:
    """Mean entropy of categorical logits."""
    with torch.no_grad():
        return float(torch.distributions.Categorical(logits=params).entropy().mean())


def test_export_matches_torch_mlp(cartpole: tuple[nn.Module, torch.Tensor]) -> None:
    net, states = cartpole
    policy = OnnxPolicy.from_bytes(export_onnx(net, states[:4]), net.dist_kind)
    for batch in (states[:1], states[:7], states):  # the batch axis is dynamic
        torch.testing.assert_close(policy.dist_params(batch), net.dist_params(batch), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(policy.value(batch), net.value(batch), rtol=1e-4, atol=1e-5)
    assert policy.dist_params(states).dtype == torch.float32
    assert policy.value(states).shape == (states.shape[0],)


def test_export_gaussian_mlp() -> None:
    env = gym.make("Pendulum-v1")
    states = torch.from_numpy(random_states(env, 16, seed=3))
    net = MLPActorCritic(3, action_desc(env.action_space)).eval()
    policy = OnnxPolicy.from_bytes(export_onnx(net, states), "gaussian")
    torch.testing.assert_close(policy.dist_params(states), net.dist_params(states), rtol=1e-4, atol=1e-5)


def test_export_matches_torch_cnn(
    pong: tuple[nn.Module, torch.Tensor], pong_graphs: dict[str, bytes]
) -> None:
    net, frames = pong
    policy = OnnxPolicy.from_bytes(pong_graphs["fp32"], "categorical")
    # Frames go in as uint8, as workers feed them; a float batch is cast to what the graph expects.
    torch.testing.assert_close(policy.dist_params(frames), net.dist_params(frames), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(policy.value(frames), net.value(frames), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        policy.dist_params(frames[:3].float()), net.dist_params(frames[:3]), rtol=1e-4, atol=1e-3
    )
    assert policy.value(frames[:1]).shape == (1,)


def test_int8_preserves_policy_and_shrinks(
    pong: tuple[nn.Module, torch.Tensor], pong_graphs: dict[str, bytes]
) -> None:
    net, frames = pong
    fp32 = OnnxPolicy.from_bytes(pong_graphs["fp32"], "categorical")
    int8 = OnnxPolicy.from_bytes(pong_graphs["int8"], "categorical", precision="int8")
    h = entropy(net.dist_params(frames))
    assert h < 0.8 * np.log(6), f"teacher too close to uniform (entropy {h:.3f})"
    kl = policy_kl(net, int8, frames)
    print(
        f"teacher entropy {h:.3f}, KL(teacher || int8) mean {float(kl.mean()):.2e} max {float(kl.max()):.2e}"
    )
    assert float(kl.mean()) < 0.01 and float(kl.max()) < 0.05, (float(kl.mean()), float(kl.max()))
    # The same policy: the int8 actor picks the teacher's greedy action on (almost) every frame.
    agree = (int8.dist_params(frames).argmax(-1) == net.dist_params(frames).argmax(-1)).float().mean()
    assert agree >= 0.9
    ratio = wire_bytes(fp32) / wire_bytes(int8)
    assert 3.5 < ratio < 4.5, ratio
    # the graph travels zlib-compressed: never more than the torch weights (random fp32 weights shrink a little)
    assert 0.85 * wire_bytes(net) < wire_bytes(fp32) <= 1.01 * wire_bytes(net)


def test_int8_graph_is_really_quantized(pong_graphs: dict[str, bytes]) -> None:
    """Every conv and hidden matmul weight is stored as int8 with a per-channel scale (speed:
    benchmarks/compress_table6.py); the two heads, which write the graph's outputs, stay float."""
    import onnx
    from onnx import TensorProto

    from frugalrl.compress.quantize import edge_layers

    model = onnx.load_from_string(pong_graphs["int8"])
    graph = model.graph
    int8_weights = [t for t in graph.initializer if t.data_type == TensorProto.INT8]
    float_weights = [t for t in graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) >= 2]
    assert len(int8_weights) >= 4  # 3 convs and the 512-unit fc
    assert sorted(t.dims[0] if t.dims[0] in (1, 6) else t.dims[1] for t in float_weights) == [1, 6]  # the heads
    assert sorted(edge_layers(onnx.load_from_string(pong_graphs["fp32"]))) == ["/actor/Gemm", "/critic/Gemm"]
    ops = {n.op_type for n in graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


def test_fp16_halves_bytes(pong: tuple[nn.Module, torch.Tensor], pong_graphs: dict[str, bytes]) -> None:
    net, frames = pong
    fp32 = OnnxPolicy.from_bytes(pong_graphs["fp32"], "categorical")
    fp16 = OnnxPolicy.from_bytes(pong_graphs["fp16"], "categorical", precision="fp16")
    ratio = wire_bytes(fp32) / wire_bytes(fp16)
    assert 1.9 < ratio < 2.1, ratio
    kl = policy_kl(net, fp16, frames)
    assert float(kl.max()) < 1e-3, float(kl.max())
    assert fp16.dist_params(frames).dtype == torch.float32


def test_quantize_and_export_stages(pong: tuple[nn.Module, torch.Tensor]) -> None:
    net, frames = pong
    chain = CompressorChain(batch_sizes=(1,)).add(Quantize("int8", calibration_size=32)).add(Export("onnx"))
    actor = chain.build(net, frames)
    assert (
        isinstance(actor, OnnxPolicy)
        and actor.precision == "int8"
        and actor.spec.kwargs["precision"] == "int8"
    )
    assert [r.stage for r in chain.reports] == ["original", "int8", "onnx"]
    assert chain.reports[1].wire_bytes < chain.reports[0].wire_bytes / 3.5
    assert chain.reports[2].wire_bytes == chain.reports[1].wire_bytes  # Export keeps the int8 graph
    assert chain.reports[2].kl_mean < 0.01
    # Export alone: an fp32 graph of the module; Quantize("fp32") is the same export.
    ctx = CompressContext(net, frames)
    exported = Export().apply(Artifact(net), ctx)
    assert exported.precision == "fp32" and exported.onnx is not None
    assert Quantize("fp32").apply(Artifact(net), ctx).precision == "fp32"
    # Quantize re-exports from the module rather than quantizing a graph that is not fp32.
    fp16 = Quantize("fp16").apply(exported, ctx)
    again = Quantize("int8", calibration_size=16).apply(fp16, ctx)
    assert again.precision == "int8" and len(again.onnx) < len(fp16.onnx)
    assert Quantize("fp16").describe() == "fp16" and Export().describe() == "onnx"
    with pytest.raises(ValueError, match="onnx"):
        Export("tflite")
    with pytest.raises(ValueError, match="precision"):
        Quantize("int4")


def test_deepcopy(pong: tuple[nn.Module, torch.Tensor], pong_graphs: dict[str, bytes]) -> None:
    _, frames = pong
    policy = OnnxPolicy.from_bytes(pong_graphs["int8"], "categorical", precision="int8")
    clone = copy.deepcopy(policy)
    assert clone is not policy and clone.spec == policy.spec
    assert clone.model.data_ptr() != policy.model.data_ptr()
    torch.testing.assert_close(clone.dist_params(frames), policy.dist_params(frames), rtol=0, atol=0)
    empty = copy.deepcopy(OnnxPolicy("categorical"))
    assert empty.model.numel() == 0


def test_wire_round_trip(pong: tuple[nn.Module, torch.Tensor], pong_graphs: dict[str, bytes]) -> None:
    _, frames = pong
    sender = OnnxPolicy.from_bytes(pong_graphs["int8"], "categorical", precision="int8")
    for codec in ("fp32", "fp16"):  # the graph bytes travel raw whatever the float codec
        msg = encode_state_dict(sender.state_dict(), codec)
        msg.meta = {"version": 1, "spec": sender.spec.to_json()}
        decoded, _ = decode_message(encode_message(msg)[0])
        worker = build_policy(PolicySpec(**decoded.meta["spec"]))
        assert isinstance(worker, OnnxPolicy) and worker.precision == "int8"
        with pytest.raises(ValueError, match="no graph yet"):
            worker.dist_params(frames[:1])
        worker.load_state_dict(decode_state_dict(decoded))
        torch.testing.assert_close(worker.dist_params(frames), sender.dist_params(frames), rtol=0, atol=0)
        torch.testing.assert_close(worker.value(frames), sender.value(frames), rtol=0, atol=0)
    # A graph of another size replaces the old one.
    worker.load_state_dict(OnnxPolicy.from_bytes(pong_graphs["fp16"], "categorical").state_dict())
    assert worker.onnx_bytes == pong_graphs["fp16"] and worker.model.numel() < len(pong_graphs["fp16"])


def test_nested_load_state_dict(cartpole: tuple[nn.Module, torch.Tensor]) -> None:
    net, states = cartpole
    graph = export_onnx(net, states[:4])

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = OnnxPolicy("categorical")
            self.scale = nn.Parameter(torch.ones(1))

    src = Holder()
    src.inner.set_model(graph)
    dst = Holder()
    dst.load_state_dict(src.state_dict())
    torch.testing.assert_close(dst.inner.dist_params(states), net.dist_params(states), rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="Missing"):
        Holder().load_state_dict({"scale": torch.ones(1)})


def test_invalid_bytes_raise_value_error(cartpole: tuple[nn.Module, torch.Tensor]) -> None:
    net, states = cartpole
    with pytest.raises(ValueError, match="not a valid ONNX model"):
        OnnxPolicy.from_bytes(b"definitely not protobuf", "categorical")
    with pytest.raises(ValueError, match="empty"):
        OnnxPolicy.from_bytes(b"", "categorical")
    policy = OnnxPolicy("categorical")
    with pytest.raises(ValueError, match="not a valid ONNX model"):
        policy.load_state_dict({"model": torch.frombuffer(bytearray(b"\x08\x07garbage"), dtype=torch.uint8)})
    with pytest.raises(ValueError, match="uint8"):
        policy.load_state_dict({"model": torch.zeros(10)})
    with pytest.raises(ValueError, match="dist_kind"):
        OnnxPolicy("beta")
    good = OnnxPolicy.from_bytes(export_onnx(net, states[:4]), "categorical")
    with pytest.raises(ValueError, match="cannot run on observations"):
        good.dist_params(torch.zeros(2, 5))


def test_onnx_actor_in_cluster_env(cartpole: tuple[nn.Module, torch.Tensor]) -> None:
    net, states = cartpole
    agent = OnnxPolicy.from_bytes(export_onnx(net, states[:4]), "categorical")
    with closing(
        ClusterEnv("CartPole-v1", num_workers=2, envs_per_worker=2, backend="local", seed=0)
    ) as envs:
        ro = envs.rollout(agent, 16)
        assert ro.obs.shape == (16, 4, 4) and ro.behaviour_logp.shape == (16, 4)
        # The workers ran the same graph: their behaviour log-probabilities are the agent's on those states.
        flat = torch.from_numpy(ro.obs.reshape(-1, 4))
        logp = torch.log_softmax(agent.dist_params(flat), -1).gather(-1, torch.from_numpy(ro.actions.reshape(-1, 1)))
        np.testing.assert_allclose(ro.behaviour_logp.reshape(-1), logp[:, 0].numpy(), rtol=1e-5, atol=1e-5)
        stats = envs.stats()
        assert stats["weight_syncs"]["total"] == 2
        assert stats["bytes"]["weights"] == 2 * agent.model.numel()
        ro2 = envs.rollout(agent, 4)  # unchanged agent: no new weights
        assert ro2.num_steps == 4 and envs.stats()["bytes"]["weights"] == 2 * agent.model.numel()


def test_an_onnx_actor_runs_in_worker_processes_without_torch(cartpole: tuple[nn.Module, torch.Tensor]) -> None:
    """AcceRL's compressed actor in a worker process: the graph runs on ONNX Runtime and is sampled and scored in
    numpy (uplink 'logprob'), the process never loads torch, and the log-probabilities are the agent's."""
    from pathlib import Path

    net, states = cartpole
    agent = OnnxPolicy.from_bytes(export_onnx(net, states[:4]), "categorical")
    with closing(ClusterEnv("CartPole-v1", num_workers=1, envs_per_worker=3, backend="local", seed=0,
                            inline_workers=0, uplink={"behaviour": "logprob"})) as envs:
        ro = envs.rollout(agent, 12)
        (pid,) = envs.backend.worker_pids().values()
        assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text()
        flat = torch.from_numpy(ro.obs.reshape(-1, 4))
        logp = torch.log_softmax(agent.dist_params(flat), -1).gather(-1, torch.from_numpy(ro.actions.reshape(-1, 1)))
        np.testing.assert_allclose(ro.behaviour_logp.reshape(-1), logp[:, 0].numpy(), rtol=1e-5, atol=1e-5)
