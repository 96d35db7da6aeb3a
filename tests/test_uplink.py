"""The experience uplink option: one contract over every backend (the learner receives exactly the arrays it
receives without a codec, and the byte meter counts the smaller payloads), the option in configs, the CLI,
config.json and ClusterEnv.stats()."""

from __future__ import annotations

import importlib.util
import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_cluster_env import fresh_agent, random_actions

from frugalrl import ClusterEnv
from frugalrl.algos.ppo import PPOConfig
from frugalrl.sync import Interval
from frugalrl.wire.uplink import (
    MIN_COMPRESS_NBYTES,
    UPLINK_OPTIONS,
    UplinkCodecs,
    UplinkOptions,
)

pytestmark = pytest.mark.timeout(180)

HAVE_RAY = importlib.util.find_spec("ray") is not None
RAY = pytest.param("ray", marks=pytest.mark.skipif(not HAVE_RAY, reason="backend='ray' needs Ray"))
W, K, T = 2, 2, 128
ROLLOUT_FIELDS = ("obs", "actions", "rewards", "terminations", "truncations", "behaviour_logp", "versions",
                  "next_obs", "final_idx", "final_obs")


@pytest.fixture
def backend(request):
    if request.param == "ray":
        request.getfixturevalue("ray_8cpus")
    return request.param


def _same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert a.tobytes() == b.tobytes(), what  # bit for bit


@pytest.mark.parametrize("backend", ["serial", "local", RAY], indirect=True)
def test_learner_receives_the_same_arrays_and_fewer_bytes(backend, closing):
    """Same seed and agent with uplink 'none' and 'auto': identical steps, infos and rollouts (every array, bit
    for bit), and fewer observation, behaviour and reward bytes with 'auto' (on a 1 Mbit/s link, where every
    saving pays for its codec: auto's decisions do not depend on this machine's speed)."""
    extra = {"ray_num_cpus": 0} if backend == "ray" else {}
    envs = {u: closing(ClusterEnv("CartPole-v1", W, K, backend=backend, seed=11,
                                  uplink=UplinkOptions(compressor=u, link_mbps=1.0, behaviour="logprob"),
                                  **extra))  # type: ignore[arg-type]
            for u in ("none", "auto")}
    agent = fresh_agent(envs["none"], seed=2)
    opt = torch.optim.SGD(agent.parameters(), lr=0.1)
    rng = np.random.default_rng(3)
    first = {u: env.reset(seed=11) for u, env in envs.items()}
    _same(first["none"][0], first["auto"][0], "reset obs")
    for t in range(5):
        actions = random_actions(envs["none"].single_action_space, W * K, rng)
        out = {u: env.step(actions) for u, env in envs.items()}
        for i, what in enumerate(("obs", "rewards", "terminations", "truncations")):
            _same(out["none"][i], out["auto"][i], f"step {t} {what}")
    for t in range(5):
        out = {u: env.step(agent) for u, env in envs.items()}
        for i, what in enumerate(("obs", "rewards", "terminations", "truncations")):
            _same(out["none"][i], out["auto"][i], f"act step {t} {what}")
        for key in ("actions", "dist_params", "policy_version"):
            _same(out["none"][4][key], out["auto"][4][key], f"act step {t} {key}")
    for it in range(3):
        ro = {u: env.rollout(agent, T) for u, env in envs.items()}
        for name in ROLLOUT_FIELDS:
            _same(getattr(ro["none"], name), getattr(ro["auto"], name), f"rollout {it} {name}")
        assert ro["none"].episode_returns == ro["auto"].episode_returns
        opt.zero_grad()
        (-agent.dist_params(torch.from_numpy(ro["none"].obs.reshape(-1, 4))).logsumexp(-1).mean()).backward()
        opt.step()
    stats = {u: env.stats() for u, env in envs.items()}
    assert stats["none"]["weight_syncs"] == stats["auto"]["weight_syncs"]
    raw, packed = stats["none"]["bytes"], stats["auto"]["bytes"]
    assert (stats["none"]["uplink"]["compressor"], stats["auto"]["uplink"]["compressor"]) == ("none", "auto")
    assert stats["none"]["uplink"]["codecs"] == {} and sum(stats["auto"]["uplink"]["codecs"]["obs"].values()) == 3 * W
    assert packed["observations"] < 0.97 * raw["observations"]  # CartPole: 4 busy floats, little to gain
    assert packed["behaviour"] < raw["behaviour"] and packed["rewards"] < 0.8 * raw["rewards"]
    assert packed["weights"] == raw["weights"] and packed["actions"] == raw["actions"]
    assert packed["messages"] == raw["messages"]
    # What the meter counts is what crossed: the same for every backend (the serial one measures the encoding).
    assert sum(v for k, v in packed.items() if k in ("observations", "rewards", "behaviour")) > 0


def test_serial_local_count_the_same_compressed_bytes(closing):
    """The serial backend measures compressed payloads by encoding them; the local one sends them: same counts."""
    envs = {b: closing(ClusterEnv("CartPole-v1", W, K, backend=b, seed=5, uplink="zstd")) for b in ("serial", "local")}
    agent = fresh_agent(envs["serial"], seed=1)
    for env in envs.values():
        env.reset(seed=5)
        env.rollout(agent, T)
        env.step(agent)
    s, loc = (envs[b].stats()["bytes"] for b in ("serial", "local"))
    for key in ("observations", "rewards", "behaviour", "control", "total", "up", "down", "per_worker"):
        assert s[key] == loc[key], key


def uplink_codecs(option: str, arrays: dict) -> dict:
    """The codecs a fresh worker with uplink ``option`` (the other options' defaults) picks for one reply."""
    return UplinkCodecs(UplinkOptions(compressor=option)).codecs(arrays)  # type: ignore[arg-type]


def test_uplink_codecs_by_stream():
    big = {"obs": np.zeros((128, 8, 8), np.float32), "rewards": np.zeros((128, 8), np.float32),
           "terminations": np.zeros((128, 8), bool), "truncations": np.zeros((128, 8), bool),
           "dist_params": np.zeros((128, 8, 4), np.float32), "actions": np.zeros((128, 8), np.uint8),
           "next_obs": np.zeros((8, 8), np.float32), "ep_r": np.zeros(3)}
    big["behaviour_logp"] = np.zeros((128, 8), np.float32)
    assert uplink_codecs("none", big) == {}
    auto = UplinkCodecs(UplinkOptions(link_mbps=1.0)).codecs(big)  # a slow link: every saving pays
    assert set(auto) == {"obs", "actions", "rewards", "terminations", "truncations", "dist_params", "behaviour_logp"}
    assert set(auto.values()) == {"zstd"}  # all-zero observations: step differences are no smaller
    assert set(uplink_codecs("lz4", big).values()) == {"lz4"}
    small = {"obs": np.zeros((8, 8), np.float32), "terminations": np.zeros(8, bool), "rewards": np.zeros(8)}
    assert uplink_codecs("auto", small) == {"terminations": "bits"}  # per-step replies: only bit-packing
    assert small["obs"].nbytes < MIN_COMPRESS_NBYTES
    with pytest.raises(ValueError, match="unknown uplink"):
        uplink_codecs("gzip", big)


def test_uplink_option_in_config_cli_and_cluster(tmp_path):
    assert PPOConfig().uplink == "auto" and set(UPLINK_OPTIONS) == {"auto", "none", "lz4", "zstd"}
    with pytest.raises(ValueError, match="uplink must be one of"):
        PPOConfig(uplink="gzip").validate()
    with pytest.raises(ValueError, match="unknown uplink"):
        ClusterEnv("CartPole-v1", 1, 1, backend="serial", uplink="gzip")
    from frugalrl.cli import main

    code = main(["train", "ppo", "--env", "CartPole-v1", "--backend", "serial", "--workers", "1",
                 "--envs-per-worker", "2", "--num-steps", "128", "--total-timesteps", "256", "--uplink", "zstd",
                 "--eval-episodes", "0", "--run-dir", str(tmp_path), "--run-name", "r", "--no-progress",
                 "--no-tensorboard", "--no-plots"])
    assert code == 0
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert config["uplink"] == "zstd" and summary["details"]["uplink"]["compressor"] == "zstd"
    assert summary["bytes"]["observations"] < 256 * 4 * 4  # CartPole: 16 raw bytes per step


@pytest.mark.parametrize("codec", ["fp32", "bf16"])
def test_recomputed_behaviour_is_what_the_workers_would_send(closing, codec):
    """uplink_behaviour 'recompute' (the default): the workers send no behaviour, and the head's log μ(a|s) from
    the words each worker holds (versions older than the learner's; bf16: the words decoded) is the one the workers
    send under 'logprob', up to float rounding; the same actions, the same syncs, no behaviour bytes."""
    envs = {b: closing(ClusterEnv("LunarLander-v3", W, K, backend="local", seed=4, sync=Interval(3),
                                  weights_codec=codec, uplink=UplinkOptions(behaviour=b)))
            for b in ("recompute", "logprob")}
    agent = fresh_agent(envs["logprob"], seed=6)
    opt = torch.optim.SGD(agent.parameters(), lr=0.2)
    for env in envs.values():
        env.reset(seed=4)
    versions = set()
    for it in range(6):
        ro = {b: envs[b].rollout(agent, T) for b in envs}
        versions |= set(ro["recompute"].versions.reshape(-1).tolist())
        np.testing.assert_allclose(ro["recompute"].behaviour_logp, ro["logprob"].behaviour_logp, rtol=1e-5, atol=1e-5)
        for name in ("obs", "actions", "rewards", "versions"):
            _same(getattr(ro["recompute"], name), getattr(ro["logprob"], name), f"rollout {it} {name}")
        opt.zero_grad()
        logits = agent.dist_params(torch.from_numpy(ro["logprob"].obs.reshape(-1, 8)))
        (-logits.log_softmax(-1)[:, it % 4].mean()).backward()  # a policy that moves: AAPS syncs now and then
        opt.step()
    assert len(versions) == 2  # versions 1 and 4: the learner's at 1 and 4, older ones at the other rollouts
    stats = {b: env.stats() for b, env in envs.items()}
    assert stats["recompute"]["weight_syncs"] == stats["logprob"]["weight_syncs"]
    assert stats["recompute"]["bytes"]["behaviour"] == 0 < stats["logprob"]["bytes"]["behaviour"]


def test_the_head_recomputes_only_for_the_spec_the_workers_hold(closing):
    """The head's check that a worker acts with the agent's spec sees a spec changed in place, not only a new one."""
    env = closing(ClusterEnv("CartPole-v1", W, K, backend="serial", seed=2, sync=Interval(100)))
    agent = fresh_agent(env, seed=1)
    env.reset(seed=2)
    env.rollout(agent, T)
    assert env.policies.can_recompute(0, agent) and env.policies.can_recompute(1, agent)
    agent.spec.kwargs["changed"] = True  # frozen dataclass, mutable kwargs: the workers hold the spec before it
    assert not env.policies.can_recompute(0, agent)
    del agent.spec.kwargs["changed"]
    assert env.policies.can_recompute(0, agent)


def test_behaviour_is_sent_where_the_head_lacks_the_workers_words(closing):
    """After a restore, the head holds none of the workers' words: they send their log-probabilities until
    their next sync."""
    env = closing(ClusterEnv("CartPole-v1", W, K, backend="serial", seed=2, sync=Interval(100)))
    agent = fresh_agent(env, seed=1)
    env.reset(seed=2)
    env.rollout(agent, T)
    assert env.stats()["bytes"]["behaviour"] == 0
    env.policies.load_state_dict(env.policies.state_dict())  # as a resumed run's head: no words held
    assert not env.policies.can_recompute(0, agent)
    ro = env.rollout(agent, T)  # no sync before this rollout
    assert env.stats()["bytes"]["behaviour"] > 0 and ro.behaviour_logp.shape == (T, W * K)


def test_behaviour_logprob_is_what_the_parameters_give(closing):
    """uplink_behaviour 'logprob' sends log μ(a|s) of each taken action: what the learner computes from the full
    parameters (up to float32 rounding: the worker computes it in numpy), in fewer bytes; the rest of the rollout
    is unchanged, bit for bit."""
    envs = {b: closing(ClusterEnv("CartPole-v1", W, K, backend="serial", seed=4, uplink=UplinkOptions(behaviour=b)))
            for b in ("logprob", "params")}
    agent = fresh_agent(envs["params"], seed=6)
    for env in envs.values():
        env.reset(seed=4)
    for it in range(2):
        lp, full = (envs[b].rollout(agent, T) for b in ("logprob", "params"))
        assert lp.dist_params is None and full.behaviour_logp is None
        assert lp.behaviour_logp.dtype == np.float32
        np.testing.assert_allclose(lp.behaviour_logp, full.behaviour_log_prob().numpy(), rtol=1e-6, atol=1e-6)
        for name in ("obs", "actions", "rewards", "terminations", "truncations", "next_obs", "final_obs"):
            _same(getattr(lp, name), getattr(full, name), f"rollout {it} {name}")
    lp_bytes, full_bytes = (envs[b].stats()["bytes"]["behaviour"] for b in ("logprob", "params"))
    assert lp_bytes < 0.6 * full_bytes  # CartPole: 1 of 2 floats per step (each compressed)


def test_auto_sends_observations_as_step_differences_where_they_are_smaller():
    """A rollout of a moving physical state goes as step differences; a 0/1 grid in floats (MinAtar's, cast) is
    smaller as it is, and auto measures which (the learner gets the same arrays either way)."""
    rng = np.random.default_rng(1)
    moving = np.cumsum(rng.normal(size=(128, 8, 6)) * 0.01, axis=0).astype(np.float32)
    grid = (rng.random((128, 8, 10, 10, 4)) < 0.02).astype(np.float32)
    codecs = {name: UplinkCodecs(UplinkOptions(link_mbps=1.0)).codecs({"obs": x})["obs"]
              for name, x in (("moving", moving), ("grid", grid))}
    assert codecs == {"moving": "steps+zstd", "grid": "zstd"}


def test_auto_weighs_codec_time_against_the_link():
    """auto compresses a stream only while its measured encode time (doubled for decoding) is under the link
    time its saving buys: on on a slow link, off on an absurdly fast one (booleans are still bit-packed)."""
    rng = np.random.default_rng(0)
    arrays = {"obs": np.round(rng.normal(size=(128, 8, 8)), 1).astype(np.float32),
              "rewards": np.ones((128, 8), np.float32), "terminations": rng.random((128, 8)) < 0.01}
    slow = UplinkCodecs(UplinkOptions(link_mbps=0.01))
    picked = slow.codecs(arrays)
    assert picked.pop("obs") in ("zstd", "steps+zstd") and picked == {"rewards": "zstd", "terminations": "zstd"}
    fast = UplinkCodecs(UplinkOptions(link_mbps=1e9))
    assert fast.codecs(arrays) == {"terminations": "bits"}
    report = fast.report()
    assert report["link_mbps"] == 1e9 and not report["probes"]["obs"]["on"] and report["probes"]["obs"]["saved_bytes"] > 0
    noise = {"obs": rng.normal(size=(128, 8, 8)).astype(np.float32) * np.float32(1e-20) ** rng.random((128, 8, 8))}
    assert UplinkCodecs(UplinkOptions(link_mbps=0.01)).codecs(noise) in ({}, {"obs": "zstd"}, {"obs": "steps+zstd"})  # decided by the saving


def test_atari_frame_stacks_travel_as_new_frames(closing):
    """ALE 4×84×84 stacks: the learner gets the very same rollouts (episode ends and autoresets included), the
    observations cost under 2 KB per env step instead of 28 KB."""
    pytest.importorskip("ale_py")
    kwargs = {"env_id": "ALE/Pong-v5", "max_episode_steps": 15}  # truncations: autoresets within the rollout
    envs = {u: closing(ClusterEnv("frugalrl.envs.atari:make_atari", 1, 2, backend="serial", seed=1,
                                  env_kwargs=kwargs, uplink=u)) for u in ("none", "auto")}
    agent = fresh_agent(envs["none"], seed=0)  # the Nature CNN
    for env in envs.values():
        env.reset(seed=1)
    for it in range(2):
        ro = {u: env.rollout(agent, 24) for u, env in envs.items()}
        assert ro["none"].truncations.any()
        for name in ROLLOUT_FIELDS:
            _same(getattr(ro["none"], name), getattr(ro["auto"], name), f"rollout {it} {name}")
    stats = envs["auto"].stats()
    assert stats["uplink"]["codecs"]["obs"] == {"frames+zstd": 2}
    steps = 2 * 24 * 2
    raw, packed = envs["none"].stats()["bytes"]["observations"], stats["bytes"]["observations"]
    assert raw / steps > 28_000 and packed / steps < 2048


def test_lossy_observations_on_request(closing):
    """uplink_obs int8: the learner's observations are within half a quantisation step of the exact ones, the
    workers still act on exact ones (same actions and rewards), and the observation bytes shrink."""
    envs = {o: closing(ClusterEnv("LunarLander-v3", 1, 4, backend="serial", seed=2, uplink=UplinkOptions(obs=o)))
            for o in ("exact", "int8")}
    agent = fresh_agent(envs["exact"], seed=1)
    for env in envs.values():
        env.reset(seed=2)
    exact, lossy = (envs[o].rollout(agent, 256) for o in ("exact", "int8"))
    for name in ("actions", "rewards", "terminations", "truncations", "behaviour_logp"):
        _same(getattr(exact, name), getattr(lossy, name), name)
    step = (exact.obs.max(axis=(0, 1)).astype(np.float64) - exact.obs.min(axis=(0, 1))) / 255
    assert (np.abs(lossy.obs - exact.obs.astype(np.float64)).max(axis=(0, 1)) <= step / 2 + 1e-6).all()
    assert envs["int8"].stats()["uplink"]["codecs"]["obs"] == {"int8+zstd": 1}
    b = {o: envs[o].stats()["bytes"]["observations"] for o in envs}
    assert b["int8"] < 0.5 * b["exact"]
    with pytest.raises(ValueError, match="needs a compressor"):
        UplinkOptions(compressor="none", obs="int8")
    with pytest.raises(ValueError, match="uplink_obs"):
        PPOConfig(uplink_obs="int4").validate()  # type: ignore[arg-type]


def float64_pendulum() -> gym.Env:
    """Pendulum observing float64 words that no float32 holds (a third of its observation), as MuJoCo's envs do."""
    space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
    return gym.wrappers.TransformObservation(gym.make("Pendulum-v1"), lambda o: o.astype(np.float64) / 3.0, space)


def test_float64_observations_travel_as_the_float32_words_the_policy_sees(closing):
    """By default (uplink_obs fp32) a rollout's float64 observations (MuJoCo's) are rounded to float32 on the worker
    before its policy acts: the learner gets those words, in half the bytes; 'exact' keeps float64. A lossy code
    applies to them too (it applied to float32 observations only before)."""
    assert UplinkOptions().obs == "fp32" and PPOConfig().uplink_obs == "fp32"
    uplinks = {"fp32": UplinkOptions(compressor="none"), "exact": UplinkOptions(compressor="none", obs="exact"),
               "int8": UplinkOptions(obs="int8")}  # raw bytes, where the cast alone shows
    envs = {o: closing(ClusterEnv(float64_pendulum, 1, 4, backend="serial", seed=3, uplink=u))
            for o, u in uplinks.items()}
    agent = fresh_agent(envs["exact"], seed=1)
    for env in envs.values():
        env.reset(seed=3)
    ro = {o: env.rollout(agent, 256) for o, env in envs.items()}
    for name in ("obs", "next_obs", "final_obs"):
        assert getattr(ro["exact"], name).dtype == np.float64, name
        assert getattr(ro["fp32"], name).dtype == np.float32, name
    assert len(ro["fp32"].final_obs) == 4  # Pendulum's 200-step episodes ended in the rollout
    _same(ro["fp32"].obs[0], ro["exact"].obs[0].astype(np.float32), "first observations")
    assert not np.array_equal(ro["exact"].obs[0], ro["exact"].obs[0].astype(np.float32))  # really float64 words
    b = {o: env.stats()["bytes"]["observations"] for o, env in envs.items()}
    assert b["fp32"] < 0.51 * b["exact"] and b["int8"] < 0.5 * b["fp32"]
    assert envs["int8"].stats()["uplink"]["codecs"]["obs"] == {"int8+zstd": 1}
    UplinkOptions(compressor="none", obs="fp32")  # no compressor needed: a cast, not a code


def test_the_policy_acts_on_the_observations_the_fragment_keeps():
    """collect_fragment with float64_as: the policy is given the float32 words that the fragment returns."""
    from frugalrl.experience import EnvGroup, collect_fragment

    seen = []

    def policy(obs):
        seen.append(obs.copy())
        return np.zeros((len(obs), 1), np.float32), np.zeros((len(obs), 2), np.float32)

    envs = [gym.wrappers.DtypeObservation(gym.make("Pendulum-v1", max_episode_steps=20), np.float64) for _ in range(2)]
    group = EnvGroup(envs)
    group.reset_all(seed=0)
    f = collect_fragment(group, policy, 30, float64_as=np.dtype(np.float32))
    group.close()
    assert f.obs.dtype == f.next_obs.dtype == f.final_obs.dtype == np.float32 and len(f.final_obs) == 2
    assert all(s.dtype == np.float32 for s in seen)
    _same(np.stack(seen), f.obs, "what the policy saw")
