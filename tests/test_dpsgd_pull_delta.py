"""DPSGD's delta-coded pulls (``pull_delta``): a worker that says which version it holds is sent only what changed,
and ends with the very parameters a full copy gives, bit for bit, through the real wire encoding."""

from __future__ import annotations

import numpy as np
import pytest

from frugalrl.dpsgd import DPSGDConfig, ParameterServer, run_dpsgd
from frugalrl.dpsgd.worker import pulled_params
from frugalrl.wire.delta import DeltaError, HeldWeights
from frugalrl.wire.message import Message, decode_message, encode_message

pytestmark = pytest.mark.timeout(120)


def _wire(msg: Message) -> tuple[Message, int]:
    """``msg`` as the worker receives it, and its bytes on the wire."""
    blob, sizes = encode_message(msg)
    return decode_message(blob)[0], sum(sizes.values())


def _request(op: str, held: HeldWeights, arrays: dict[str, np.ndarray] | None = None, **meta) -> Message:
    if held.version is not None:
        meta["held"] = held.version
    return Message(op, meta, arrays or {}, {})


@pytest.mark.parametrize("codec", ["fp32", "bf16", "fp16"])
def test_pulled_deltas_give_the_full_copys_parameters_bit_for_bit(codec):
    rng = np.random.default_rng(0)
    v0 = rng.normal(size=5000).astype(np.float32)
    kw = {"rho": 1.0, "master_batch": 1, "workers": 2, "pull_codec": codec}
    coded, plain = ParameterServer(v0, pull_delta=True, **kw), ParameterServer(v0, pull_delta=False, **kw)
    held = [HeldWeights(), HeldWeights()]
    delta_bytes, full_bytes, deltas = 0, 0, 0
    for step in range(12):
        worker = step % 2
        update = (rng.normal(size=v0.size) * 1e-3).astype(np.float32)
        if step % 5 == 4:  # a few large changes to a few parameters only (the sparse coding)
            update[:] = 0
            update[rng.choice(v0.size, 20, replace=False)] = 1.0
        if held[worker].version is None:
            got, n = _wire(coded.handle(worker, _request("pull", held[worker])))
            want, m = _wire(plain.handle(worker, Message("pull")))
        else:
            push = {"version": held[worker].version, "steps": 1}
            got, n = _wire(coded.handle(worker, _request("push", held[worker], {"grad/w": update}, **push)))
            want, m = _wire(plain.handle(worker, Message("push", dict(push), {"grad/w": update})))
        deltas += "base" in got.meta
        delta_bytes, full_bytes = delta_bytes + n, full_bytes + m
        v = pulled_params(got, held[worker], v0.size)
        expected = pulled_params(want, HeldWeights(), v0.size)
        assert v.dtype == np.float32 and v.view(np.uint32).tolist() == expected.view(np.uint32).tolist()
        assert held[worker].version == got.meta["version"] == want.meta["version"]
    assert deltas == 10  # every pull but each worker's first
    assert delta_bytes < full_bytes


def test_a_worker_that_holds_another_version_gets_a_full_copy():
    v0 = np.arange(1000, dtype=np.float32)
    server = ParameterServer(v0, rho=1.0, master_batch=1, workers=1, pull_codec="fp32", pull_delta=True)
    first, _ = _wire(server.handle(0, Message("pull")))
    assert "base" not in first.meta and first.meta["codec"] == "fp32"
    server.push(0, np.ones_like(v0), 0)
    stale, _ = _wire(server.handle(0, Message("pull", {"held": 7})))  # not what the server last sent it
    assert "base" not in stale.meta
    fresh, _ = _wire(server.handle(0, Message("pull")))  # a replacement worker holds nothing
    assert "base" not in fresh.meta
    held = HeldWeights()
    np.testing.assert_array_equal(pulled_params(fresh, held, v0.size), v0 + 1)
    server.push(0, np.ones_like(v0), 1)
    delta, _ = _wire(server.handle(0, Message("pull", {"held": held.version})))
    assert delta.meta["base"] == 1
    with pytest.raises(DeltaError):  # a delta against words this copy does not hold: the worker pulls in full
        pulled_params(delta, HeldWeights(), v0.size)
    np.testing.assert_array_equal(pulled_params(delta, held, v0.size), v0 + 2)


def test_a_run_pulls_fewer_bytes_with_deltas_and_learns_the_same():
    kw = {"n": 300, "dim": 400, "batch_size": 4, "seed": 3}
    cfg = DPSGDConfig(problem="frugalrl.dpsgd.problems:least_squares", problem_kwargs=kw, workers=1, processes=1,
                      local_steps=3, master_batch=1, rho=1.0, eta=0.01, global_updates=15, pull_codec="bf16")
    on, off = run_dpsgd(cfg), run_dpsgd(DPSGDConfig(**{**cfg.__dict__, "pull_delta": False}))
    np.testing.assert_array_equal(on["params"], off["params"])  # one worker: the same run, exactly
    assert off["bytes"]["down"]["weights"] == 2 * 400 * off["pulls"]
    assert on["bytes"]["down"]["weights"] < off["bytes"]["down"]["weights"]
