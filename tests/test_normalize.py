"""Running normalisation: exact statistics, inside the agent, on the wire losslessly, on the learner for rewards and
the critic's targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from frugalrl.algos import impala, ppo, resume
from frugalrl.algos.ppo import PPOConfig
from frugalrl.driver import Callback
from frugalrl.nets import MLPActorCritic, acting_state, build_policy
from frugalrl.normalize import ObsNormalizer, ReturnScaler, RunningMeanStd, ValueNormalizer
from frugalrl.runs import read_checkpoint
from frugalrl.sync import EveryUpdate
from frugalrl.sync_state import PolicySync
from frugalrl.wire.delta import HeldWeights, from_words
from frugalrl.wire.message import decode_message, encode_message

BOX = {"type": "box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]}


def test_running_mean_std_equals_numpy_over_batches():
    rng = np.random.default_rng(0)
    rms = RunningMeanStd((3,), eps=0.0)
    chunks = [rng.normal(5.0, 3.0, size=(n, 3)) for n in (1, 7, 64, 200)]
    for c in chunks:
        rms.update(torch.from_numpy(c))
    data = np.concatenate(chunks)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-10)
    assert rms.count.item() == len(data)


def test_obs_normalizer_clips_and_centres():
    norm = ObsNormalizer((2,), clip=5.0)
    norm.update(torch.tensor([[10.0, -4.0], [12.0, -2.0], [14.0, 0.0]]))
    out = norm(torch.tensor([[12.0, -2.0], [1000.0, -2.0]]))
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out[0].numpy(), [0.0, 0.0], atol=1e-3)  # count starts at 1e-4, as in SB3
    assert out[1, 0] == 5.0  # clipped


def test_statistics_travel_exactly_with_lossy_weights_and_rebuild_anywhere():
    torch.manual_seed(0)
    agent = MLPActorCritic(4, BOX, [16], obs_norm=True)
    agent.obs_norm.update(torch.randn(100, 4) * 7 + 3)
    sync = PolicySync(1, EveryUpdate(), "bf16", 16)
    sync.track(agent)
    msg = sync.message(agent)
    # The statistics travel as they are (float64), the weights as bf16 code words.
    assert msg.arrays["w/obs_norm.mean"].dtype == np.float64 and msg.arrays["w/actor.0.weight"].dtype == np.uint16
    decoded, sizes = decode_message(encode_message(msg)[0])
    worker_copy = build_policy(decoded.meta["spec"])  # how a worker builds it: from the spec, then the tensors
    like = {k: (tuple(t.shape), t.numpy().dtype) for k, t in acting_state(worker_copy).items()}  # no critic
    state = from_words(HeldWeights().resolve(decoded), like, decoded.meta["codec"])
    worker_copy.load_state_dict({k: torch.from_numpy(a) for k, a in state.items()}, strict=False)
    assert torch.equal(worker_copy.obs_norm.mean, agent.obs_norm.mean)
    assert torch.equal(worker_copy.obs_norm.var, agent.obs_norm.var)
    obs = torch.randn(8, 4) * 7 + 3
    assert torch.allclose(worker_copy.dist_params(obs), agent.dist_params(obs), atol=0.05)  # bf16 weights only
    assert sizes["weights"] > 0


def test_return_scaler_divides_by_the_discounted_return_std():
    scaler = ReturnScaler(gamma=0.5, num_envs=2)
    rewards = np.ones((4, 2), dtype=np.float32) * 10
    dones = np.zeros((4, 2), dtype=bool)
    dones[1, 0] = True
    scaled = scaler.scale(rewards, dones)
    seen = np.array([[10, 10], [15, 15], [10, 17.5], [15, 18.75]])  # env 0 resets after step 1
    assert np.allclose(scaled, np.clip(10 / np.sqrt(seen.var() + 1e-8), -10, 10), rtol=1e-3)  # count starts at 1e-4
    state = scaler.state_dict()
    other = ReturnScaler(gamma=0.5, num_envs=2)
    other.load_state_dict(state)
    assert np.array_equal(other.returns, scaler.returns)
    assert torch.equal(other.rms.var, scaler.rms.var)
    bigger = ReturnScaler(gamma=0.5, num_envs=3)  # a resume on more envs: their episodes start anew
    bigger.load_state_dict(state)
    assert np.array_equal(bigger.returns, np.zeros(3)) and torch.equal(bigger.rms.var, scaler.rms.var)
    other.episodes_restarted([1])  # env 1 could not be rebuilt exactly
    assert other.returns[0] == scaler.returns[0] and other.returns[1] == 0.0
    other.episodes_restarted()
    assert not other.returns.any()


def test_value_normalizer_standardises_targets_and_maps_outputs_back():
    norm = ValueNormalizer()
    returns = torch.tensor([-900.0, -500.0, -100.0, -700.0], dtype=torch.float64)
    norm.update(returns)
    targets = norm.normalize(returns)
    # the statistics' count starts at 1e-4, so the standardised targets are centred to within that
    assert abs(targets.mean().item()) < 1e-3 and abs(targets.std(unbiased=False).item() - 1) < 1e-3
    assert torch.allclose(norm.denormalize(targets), returns)
    other = ValueNormalizer()
    other.load_state_dict(norm.state_dict())
    assert torch.equal(other.normalize(returns), targets)


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_a_run_with_value_normalisation_saves_it_and_resumes_bit_identical(tmp_path, algo):
    """``norm_value``: the statistics are a part of the checkpoint, so a run stopped and resumed ends with the
    weights of the same run left alone; the critic then outputs standardised values (Pendulum's returns are
    hundreds below zero). IMPALA's V-trace targets take the same path as PPO's GAE returns."""
    module, config = (ppo, PPOConfig) if algo == "ppo" else (impala, impala.IMPALAConfig)
    cfg = dict(env="Pendulum-v1", backend="serial", workers=2, envs_per_worker=1, num_steps=64, num_minibatches=2,
               update_epochs=2, total_timesteps=128 * 6, norm_reward=False, norm_value=True, seed=3,
               run_dir=str(tmp_path), progress=False, plots=False, tensorboard=False, eval_episodes=1,
               **({"overlap": False, "eval_every": 0} if algo == "impala" else {}))
    train = module.train
    straight = train(config(**cfg, run_name="straight"))

    class StopAt(Callback):
        def on_update(self, run, update, row):
            return run.updates < 3

    cut = train(config(**cfg, run_name="cut"), callbacks=[StopAt()])
    assert cut["updates"] == 3 and read_checkpoint(cut["run_dir"])["parts"]["value_norm"]["rms"]["count"] > 128
    resumed = resume(cut["run_dir"])
    a, b = read_checkpoint(straight["run_dir"])["parts"], read_checkpoint(resumed["run_dir"])["parts"]
    assert torch.equal(a["value_norm"]["rms"]["mean"], b["value_norm"]["rms"]["mean"])
    assert a["value_norm"]["rms"]["mean"] < -100
    for key in a["agent"]:
        assert torch.equal(a["agent"][key], b["agent"][key]), key


def test_a_resume_that_turns_value_normalisation_off_says_its_statistics_are_dropped(tmp_path, caplog):
    """A critic fitted to standardised returns, resumed with ``norm_value`` off, reads its outputs as returns: the
    run says that the checkpoint's statistics are not used, rather than dropping them silently."""
    cfg = PPOConfig(env="Pendulum-v1", backend="serial", workers=1, envs_per_worker=1, num_steps=64,
                    num_minibatches=2, update_epochs=1, total_timesteps=128, norm_reward=False, norm_value=True,
                    seed=4, run_dir=str(tmp_path), progress=False, plots=False, tensorboard=False, eval_episodes=1)
    first = ppo.train(cfg)
    with caplog.at_level("WARNING", logger="frugalrl"):
        resume(first["run_dir"], total_timesteps=192, norm_value=False)
    assert any("'value_norm' is not used" in r.getMessage() for r in caplog.records)
