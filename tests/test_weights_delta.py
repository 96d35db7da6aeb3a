"""Delta-coded weights (frugalrl.wire.delta): a worker that applies a delta holds, bit for bit, what a full copy of
that version gives it; a delta against a copy the worker does not hold is refused and a full copy follows; the
policy spec travels only to a worker that does not hold it; a resumed run assumes the workers hold nothing."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from test_cluster_env import fresh_agent

from frugalrl import AAPS, ClusterEnv, EveryUpdate
from frugalrl.envs.spec import to_env_spec
from frugalrl.envs.worker import EnvWorker
from frugalrl.nets import acting_state
from frugalrl.sync_state import PolicySync
from frugalrl.wire.delta import (
    HeldWeights,
    difference,
    from_words,
    full_message,
    to_words,
    undo_difference,
    weights_update,
)
from frugalrl.wire.message import Message, WireError, decode_message, encode_message, message_sizes, uncarried

pytestmark = pytest.mark.timeout(180)

FLOAT_CODECS = ("fp32", "bf16", "fp16", "int8")


def _bits(a: np.ndarray) -> np.ndarray:
    """An array's bytes, to compare bit for bit (NaN payloads and signed zeros included)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _over_the_wire(msg: Message) -> Message:
    return decode_message(encode_message(msg)[0])[0]


def _like(state: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {k: (a.shape, a.dtype) for k, a in state.items()}


def _check_exact(old: dict[str, np.ndarray], new: dict[str, np.ndarray], codec: str, exact=("stats",)) -> Message:
    """Delta from ``old`` to ``new``: it is never larger than the full copy, and a receiver holding ``old`` gets,
    through the wire or handed the message as it is, the full copy's words and decoded arrays bit for bit; the
    compressed payloads it holds (``Message.payloads``) are the ones a fresh encoding makes."""
    base, target = to_words(old, codec, exact), to_words(new, codec, exact)
    meta = {"version": 2, "codec": codec}
    full = full_message(target, meta)
    msg = weights_update(target, base, meta, 1)
    assert sum(message_sizes(msg).values()) <= sum(message_sizes(full).values())
    # The payloads the coder kept from choosing are what encoding them again gives: the same bytes on the wire.
    fresh = Message(msg.op, msg.meta, msg.arrays, msg.codecs, msg.kinds)
    assert encode_message(msg) == encode_message(fresh) and message_sizes(msg) == message_sizes(fresh)
    assert set(msg.payloads) == {n for n, c in msg.codecs.items() if c == "zstd"}
    reference = from_words(HeldWeights().resolve(_over_the_wire(full)), _like(new), codec)
    for received in (msg, _over_the_wire(msg)):
        words = HeldWeights(1, base).resolve(received)
        assert list(words) == list(target)
        for key in target:
            np.testing.assert_array_equal(_bits(words[key]), _bits(target[key]), err_msg=key)
        decoded = from_words(words, _like(new), codec)
        for key in new:
            assert decoded[key].dtype == new[key].dtype and decoded[key].shape == new[key].shape
            np.testing.assert_array_equal(_bits(decoded[key]), _bits(reference[key]), err_msg=key)
    return msg


def _state(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"w": rng.standard_normal((n, 3)).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32),
            "stats": rng.standard_normal(4), "count": np.array(rng.integers(0, 1 << 40), dtype=np.int64)}


def test_a_few_changed_words_travel_as_a_sparse_list_and_a_rewrite_as_a_full_copy():
    rng = np.random.default_rng(0)
    old = _state(rng, 2000)
    few = {k: v.copy() for k, v in old.items()}
    few["w"][rng.integers(0, 2000, 30), 1] += 0.5
    msg = _check_exact(old, few, "fp32")
    assert msg.meta["base"] == 1 and "crc" in msg.meta and {"wd/i4", "wd/v4"} <= set(msg.arrays)
    assert message_sizes(msg)["weights"] < 400  # 30 changed words of 8000
    unchanged = weights_update(to_words(old, "bf16"), to_words(old, "bf16"), {"version": 2, "codec": "bf16"}, 1)
    assert not unchanged.arrays and "base" in unchanged.meta  # nothing changed: the header alone
    rewritten = {k: rng.integers(0, 256, v.nbytes, dtype=np.uint8).view(v.dtype).reshape(v.shape)
                 for k, v in old.items()}  # random bits: no XOR compresses
    msg = _check_exact(old, rewritten, "fp32")
    assert "base" not in msg.meta and set(msg.arrays) == {f"w/{k}" for k in old}  # a delta would not be smaller


def test_weights_that_moved_a_few_ulps_travel_as_a_difference():
    """A training step moves most weights by a few ulps: their difference in float order is smaller than their XOR
    (a carry flips every bit it crosses), and it rebuilds the same words."""
    rng = np.random.default_rng(2)
    old = _state(rng, 4000)
    new = {k: v.copy() for k, v in old.items()}
    for key in ("w", "b"):
        step = 5e-4 * rng.choice([-1.0, 1.0], new[key].shape) * rng.uniform(0.2, 1.0, new[key].shape)
        new[key] = (new[key] + 20 * step).astype(np.float32)  # 20 Adam-like steps since the worker's copy
    msg = _check_exact(old, new, "bf16")
    assert "wd/d2" in msg.arrays and "wd/x2" not in msg.arrays


def test_the_difference_in_float_order_is_a_bijection_on_any_words():
    rng = np.random.default_rng(3)
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        top = np.iinfo(dtype).max
        edges = np.array([0, 1, top, top >> 1, (top >> 1) + 1], dtype=dtype)  # ±0, the largest, the sign bit
        old = np.concatenate([rng.integers(0, top, 5000, dtype=dtype, endpoint=True), edges, edges])
        new = np.concatenate([rng.integers(0, top, 5000, dtype=dtype, endpoint=True), edges, edges[::-1]])
        diff = difference(old, new)
        assert diff.dtype == old.dtype
        np.testing.assert_array_equal(undo_difference(old, diff), new)
    floats = np.array([-np.inf, -3.0, -1e-30, -0.0, 0.0, 1e-30, 2.0, np.inf], dtype=np.float32).view(np.uint32)
    up = difference(floats[:-1], floats[1:])
    assert (up % 2 == 0).all() and (up > 0).all()  # each larger than the last: positive (zigzag: even, non-zero)
    assert up[3] == 2  # -0.0 to 0.0: the next word in float order, +1


def test_a_delta_against_another_copy_is_refused():
    rng = np.random.default_rng(1)
    v1, v2, v3 = (to_words(_state(rng, 50), "bf16") for _ in range(3))
    meta = {"version": 3, "codec": "bf16"}
    with pytest.raises(ValueError, match="holds version 1"):
        HeldWeights(1, v1).resolve(weights_update(v3, v2, meta, 2))
    with pytest.raises(ValueError, match="holds version None"):
        HeldWeights().resolve(weights_update(v3, v2, meta, 2))
    # Version 2 named but other words held (a worker that is not what the head thinks): the checksum tells.
    with pytest.raises(ValueError, match="checksum"):
        HeldWeights(2, v1).resolve(weights_update(v3, v2, meta, 2))


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError:  # pragma: no cover - the property test needs Hypothesis
    given = None

if given is not None:

    @pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # fp16 of weights beyond its range: inf
    @settings(max_examples=80, deadline=None)
    @given(
        old=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=40),
                       elements=st.floats(width=32, allow_nan=True, allow_infinity=True)),
        data=st.data(),
        codec=st.sampled_from(FLOAT_CODECS),
    )
    def test_property_delta_rebuilds_the_full_copy_bit_for_bit(old, data, codec):
        """Any base, any changes (none, a few tiny ones that bf16 may round away, NaNs, all of them), every codec:
        the receiver's words and weights equal the full copy's, bit for bit; the message is never larger."""
        if codec == "int8":  # int8 encodes finite weights only
            old = np.nan_to_num(old, nan=0.0, posinf=1e30, neginf=-1e30)
        mask = data.draw(hnp.arrays(np.bool_, old.shape))
        scale = data.draw(st.sampled_from([0.0, 1e-7, 1e-3, 1.0]))
        noise = data.draw(hnp.arrays(np.float32, old.shape, elements=st.floats(-1, 1, width=32)))
        with np.errstate(all="ignore"):
            new = np.where(mask, old * (1 + scale * noise) + scale * noise, old).astype(np.float32)
        if codec == "int8":
            new = np.nan_to_num(new, nan=0.0, posinf=1e30, neginf=-1e30)
        extra = {"stats": np.arange(3, dtype=np.float64) * scale, "count": np.array([7, int(mask.sum())])}
        _check_exact({"w": old, **extra, "count": np.array([7, 0])}, {"w": new, **extra}, codec)


# ---------------------------------------------------------------------------------------------- through ClusterEnv
def _train(env: ClusterEnv, agent: torch.nn.Module, updates: int, lr: float = 3e-3) -> list[np.ndarray]:
    """Rollouts with an Adam step after each (towards action 0); the rollouts' actions, behaviour log-probabilities
    and versions."""
    opt = torch.optim.Adam(agent.parameters(), lr=lr)
    out = []
    for _ in range(updates):
        ro = env.rollout(agent, 16)
        out += [ro.actions, ro.behaviour_logp, ro.versions]
        opt.zero_grad()
        (-torch.log_softmax(agent.dist_params(torch.from_numpy(ro.obs.reshape(-1, 4))), -1)[:, 0].mean()).backward()
        opt.step()
    return out


def _worker_weights(env: ClusterEnv) -> list[dict[str, np.ndarray]]:
    """What each worker's policy holds, from its snapshot (any backend)."""
    return [{k[2:]: a.numpy() for k, a in snap["arrays"].items() if k.startswith("w/")}
            for snap in env.state_dict()["workers"]]


def _workers(env: ClusterEnv) -> list[EnvWorker]:
    """The serial backend's in-process workers."""
    backend = env.backend
    workers = getattr(backend, "workers", None)
    return list(workers) if workers is not None else [backend.inline.workers[w] for w in range(env.num_workers)]


def _record_requests(env: ClusterEnv) -> list[tuple[int, Message]]:
    """Every (worker, request) sent from now on, the weights a request carries (a rollout's) just before it."""
    sent: list[tuple[int, Message]] = []
    request = env.backend.request

    def recording(requests):
        for w, msg in requests.items():
            _, inside = uncarried(msg)
            sent.extend([(w, inside), (w, msg)] if inside is not None else [(w, msg)])
        return request(requests)

    env.backend.request = recording
    return sent


@pytest.mark.parametrize("codec", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["serial", "local"])
def test_workers_hold_what_full_copies_give(backend, codec, closing):
    """AAPS syncs each worker on its own: deltas against several bases. Every worker's weights equal, bit for bit,
    those of the same run sent full copies, the rollouts are the same, and the deltas cost fewer bytes."""
    # seed 1: AAPS leaves the two workers at different versions in 4 of the 8 rollouts (with fp32 and bf16)
    envs = {d: closing(ClusterEnv("CartPole-v1", 2, 2, backend=backend, seed=1, weights_codec=codec,
                                  sync=AAPS(0.03, max_lag=3), weights_delta=d, replayable=True))
            for d in (True, False)}
    outs = {}
    for d, env in envs.items():
        agent = fresh_agent(env, seed=2)
        outs[d] = _train(env, agent, 8, lr=3e-2)
        env.send_weights(agent, force=True)
    for a, b in zip(outs[True], outs[False], strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(len(np.unique(v)) > 1 for v in outs[True][2::3])  # the workers held different versions
    held = {d: _worker_weights(env) for d, env in envs.items()}
    for w in range(2):
        for key, value in held[False][w].items():
            np.testing.assert_array_equal(_bits(held[True][w][key]), _bits(value), err_msg=f"worker {w}: {key}")
    stats = {d: env.stats() for d, env in envs.items()}
    assert stats[True]["weight_syncs"]["total"] == stats[False]["weight_syncs"]["total"]
    assert stats[True]["weight_syncs"]["delta"] > 0 and stats[False]["weight_syncs"]["delta"] == 0
    assert stats[True]["bytes"]["weights"] < stats[False]["bytes"]["weights"]


def test_serial_and_local_count_the_same_delta_bytes(closing):
    envs = {b: closing(ClusterEnv("CartPole-v1", 2, 2, backend=b, seed=9, weights_codec="bf16", sync=EveryUpdate()))
            for b in ("serial", "local")}
    for env in envs.values():
        _train(env, fresh_agent(env, seed=3), 5)
    stats = {b: env.stats() for b, env in envs.items()}
    assert stats["serial"]["weight_syncs"] == stats["local"]["weight_syncs"]
    assert stats["serial"]["weight_syncs"]["delta"] == 8  # every sync after the first, to both workers
    assert stats["serial"]["bytes"] == stats["local"]["bytes"]


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_a_sync_rides_in_the_rollout_request_and_changes_nothing_else(backend, closing):
    """A rollout that syncs sends each chosen worker one request carrying the weights (one round trip, not two):
    the same rollouts, versions, syncs and weight bytes as weights sent on their own first, and no more header
    bytes (one header fewer per sync, the rollout's unnumbered where it carries)."""
    envs = [closing(ClusterEnv("CartPole-v1", 2, 2, backend=backend, seed=4, weights_codec="bf16", sync=rule))
            for rule in (AAPS(0.01), AAPS(0.01))]  # a rule each: they keep state
    sent = _record_requests(envs[1])
    outs = []
    for i, env in enumerate(envs):
        agent = fresh_agent(env, seed=5)
        opt = torch.optim.Adam(agent.parameters(), lr=3e-2)
        out = []
        for _ in range(6):
            if i == 0:
                env.send_weights(agent)  # on its own: the rollout then finds nothing to sync
            ro = env.rollout(agent, 16)
            out += [ro.obs, ro.actions, ro.behaviour_logp, ro.versions]
            opt.zero_grad()
            (-torch.log_softmax(agent.dist_params(torch.from_numpy(ro.obs.reshape(-1, 4))), -1)[:, 0].mean()).backward()
            opt.step()
        outs.append(out)
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)
    alone, riding = (env.stats() for env in envs)
    assert alone["weight_syncs"] == riding["weight_syncs"] and riding["weight_syncs"]["total"] > 2
    assert alone["bytes"]["weights"] == riding["bytes"]["weights"]
    assert riding["bytes"]["control"] <= alone["bytes"]["control"]
    # one round trip, not two: each carried sync saves a request and its reply
    assert riding["bytes"]["messages"] == alone["bytes"]["messages"] - 2 * riding["weight_syncs"]["total"]
    rollouts = [m for _, m in sent if m.op == "rollout"]
    assert [m.op for _, m in sent].count("weights") == riding["weight_syncs"]["total"]  # every one carried
    assert len(rollouts) == 2 * 6 and sum("carries" in m.meta for m in rollouts) == riding["weight_syncs"]["total"]


def test_step_with_an_agent_carries_its_weights_too(closing):
    """``step(agent)``'s act_step requests carry the weights of the workers that sync: no weights request of their
    own, the same actions and versions as weights sent first."""
    envs = [closing(ClusterEnv("CartPole-v1", 2, 2, backend="serial", seed=6, sync=EveryUpdate())) for _ in range(2)]
    sent = _record_requests(envs[1])
    outs = []
    for i, env in enumerate(envs):
        agent = fresh_agent(env, seed=7)
        env.reset(seed=6)
        out = []
        for t in range(6):
            if t % 2 == 0:
                with torch.no_grad():
                    for p in agent.parameters():
                        p.add_(0.01)  # a new version: every worker syncs
                if i == 0:
                    env.send_weights(agent)
            obs, _, _, _, infos = env.step(agent)
            out += [obs, infos["actions"], infos["policy_version"]]
        outs.append(out)
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert [m.op for _, m in sent].count("weights") == envs[1].stats()["weight_syncs"]["total"] == 6
    assert sum("carries" in m.meta for _, m in sent if m.op == "act_step") == 6


def test_a_request_that_fails_after_its_carried_weights_leaves_the_worker_resynced(closing, caplog):
    """An env that raises in a rollout whose request carried a delta: the head cannot tell whether the worker loaded
    it, so it takes the worker to hold nothing; caught, the next rollout sends it a full copy at once (not a delta
    against the copy it held before, which it would refuse)."""
    env = closing(ClusterEnv("CartPole-v1", 2, 2, backend="serial", seed=8, sync=EveryUpdate()))
    agent = fresh_agent(env, seed=9)
    for _ in range(2):
        env.rollout(agent, 8)
        with torch.no_grad():
            for p in agent.parameters():
                p.add_(0.05)
    inner = _workers(env)[1].group.envs[0]
    step = inner.step

    def raising(action):
        inner.step = step
        raise RuntimeError("the env broke")

    inner.step = raising
    with pytest.raises(RuntimeError, match="the env broke"):
        env.rollout(agent, 8)  # worker 1 loaded the delta, then its env raised
    assert env.worker_versions[1] is None  # what it holds: unknown
    sent = _record_requests(env)
    with caplog.at_level(logging.WARNING, logger="frugalrl"):
        ro = env.rollout(agent, 8)
    assert "refused" not in caplog.text
    to_1 = [m for w, m in sent if w == 1 and m.op == "weights"]
    assert len(to_1) == 1 and "base" not in to_1[0].meta and "spec" in to_1[0].meta  # a full copy
    assert env.worker_versions == [env.learner_version] * 2
    assert np.isfinite(ro.behaviour_logp).all()


def test_a_request_carries_weights_and_nothing_else():
    """A worker loads the weights a request carries before answering it; it refuses to run any other operation
    that way (nothing but weights may ride in a request)."""
    from frugalrl.wire.message import carrying

    weights = Message("weights", {"version": 3}, {"w/x": np.ones(2, np.float32)})
    outer, inside = uncarried(carrying(Message("rollout", {"num_steps": 4}), weights))
    assert (outer.op, outer.meta, outer.arrays) == ("rollout", {"num_steps": 4}, {})
    assert inside is not None and (inside.op, inside.meta) == ("weights", {"version": 3})
    assert inside.arrays["w/x"] is weights.arrays["w/x"]  # shared, not copied
    assert uncarried(outer) == (outer, None)
    with pytest.raises(WireError, match="not a message"):
        uncarried(Message("rollout", {"carries": "weights"}))
    worker = EnvWorker(0, to_env_spec("CartPole-v1"), 1)
    reply = worker.handle(carrying(Message("reset", {"seed": 1}), Message("close")))
    assert reply.op == "error" and "weights only" in reply.meta["error"]
    with pytest.raises(ValueError, match="cannot carry"):
        carrying(carrying(Message("rollout"), Message("weights")), Message("weights"))
    with pytest.raises(ValueError, match="has arrays"):
        carrying(Message("step", {}, {"actions": np.zeros(2)}), Message("weights"))
    worker.close()


def test_a_refused_delta_is_followed_by_a_full_copy_and_the_spec_goes_once(closing, caplog):
    env = closing(ClusterEnv("CartPole-v1", 2, 1, backend="serial", seed=0, weights_codec="bf16"))
    sent = _record_requests(env)
    agent = fresh_agent(env, seed=1)
    _train(env, agent, 3)
    weights = [(w, m) for w, m in sent if m.op == "weights"]
    assert [w for w, m in weights if "spec" in m.meta] == [0, 1]  # the first sync of each worker only
    assert all(not k.startswith("w/critic.") for _, m in weights for k in m.arrays)  # nor a critic's words
    assert all("base" in m.meta for _, m in weights[2:])
    # Worker 1 lost its copy without the head knowing (a worker replaced unseen): it refuses the next delta.
    _workers(env)[1].held.clear()
    del sent[:]
    with caplog.at_level(logging.WARNING, logger="frugalrl"):
        env.rollout(agent, 4)  # the agent changed since the last sync
    assert "worker 1 refused a weights delta" in caplog.text
    to_1 = [m for w, m in sent if w == 1 and m.op == "weights"]
    assert ["base" in m.meta for m in to_1] == [True, False]  # the refused delta, then a full copy
    expected = from_words(to_words({k: t.numpy() for k, t in agent.state_dict().items()}, "bf16"),
                          {k: (tuple(t.shape), t.numpy().dtype) for k, t in agent.state_dict().items()}, "bf16")
    for worker in _workers(env):
        acting = worker.held_state()
        assert acting and not any(k.startswith("critic.") for k in acting)  # workers are sent the actor alone
        for key, a in acting.items():
            np.testing.assert_array_equal(_bits(a), _bits(expected[key]), err_msg=key)
    assert env.stats()["weight_syncs"]["delta"] == 2 * 2 + 1  # worker 1's last sync was a full copy
    # A replaced worker gets a full copy with the spec again.
    env._restart(0, "test")
    del sent[:]
    _train(env, agent, 1)
    to_0 = [m for w, m in sent if w == 0 and m.op == "weights"]
    assert len(to_0) == 1 and "spec" in to_0[0].meta and "base" not in to_0[0].meta


def test_resume_sends_full_copies(closing):
    env = closing(ClusterEnv("CartPole-v1", 2, 1, backend="serial", seed=4, replayable=True))
    agent = fresh_agent(env, seed=1)
    _train(env, agent, 2)
    state = env.state_dict()
    assert not any(k.startswith("_") for k in state["policies"])
    resumed = closing(ClusterEnv("CartPole-v1", 2, 1, backend="serial", seed=4, replayable=True))
    resumed.load_state_dict(state)
    sent = _record_requests(resumed)
    _train(resumed, agent, 2)
    resumed.rollout(agent, 4)  # the last update reaches the workers
    weights = [(w, m) for w, m in sent if m.op == "weights"]
    assert [(w, "spec" in m.meta, "base" in m.meta) for w, m in weights] == [
        (0, True, False), (1, True, False), *[(0, False, True), (1, False, True)] * 2]
    for worker in _workers(resumed):
        held = worker.held_state()
        assert set(held) == set(acting_state(agent))
        for key, a in held.items():
            assert torch.equal(torch.from_numpy(a), agent.state_dict()[key]), key


def test_policy_sync_keeps_only_the_words_workers_hold():
    sync = PolicySync(2, EveryUpdate(), "fp32", 4)
    agent = fresh_agent(_spaces(), seed=0)
    for _ in range(3):
        with torch.no_grad():
            agent.actor[-1].bias.add_(1e-3)
        sync.track(agent)
        sync.sent(agent, [0])
    assert set(sync._words) == {sync.learner_version}
    assert sync._bases == [sync.learner_version, None]


def _spaces():
    """An object with CartPole's spaces (what fresh_agent reads)."""
    import gymnasium as gym

    class Spaces:
        single_observation_space = gym.spaces.Box(-1, 1, (4,))
        single_action_space = gym.spaces.Discrete(2)

    return Spaces()


def test_worker_answers_refused_for_a_delta_it_cannot_apply():
    worker = EnvWorker(0, to_env_spec("CartPole-v1"), 1)
    agent = fresh_agent(_spaces(), seed=0)
    sync = PolicySync(1, EveryUpdate(), "bf16", 4)
    sync.track(agent)
    assert worker.handle(sync.message(agent, 0)).op == "ok"
    sync.sent(agent, [0])
    with torch.no_grad():
        agent.actor[-1].bias.add_(1.0)
    sync.track(agent)
    delta = sync.message(agent, 0)
    assert "base" in delta.meta and "spec" not in delta.meta
    stale = Message("weights", {**delta.meta, "base": delta.meta["base"] - 1}, delta.arrays, delta.codecs)
    reply = worker.handle(stale)
    assert reply.op == "refused" and "holds version 1" in reply.meta["error"] and worker.version == 1
    assert worker.handle(delta).op == "ok" and worker.version == 2
