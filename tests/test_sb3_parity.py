"""The SB3 adapter against SB3's own ``make_vec_env`` and ``DummyVecEnv``: the same arguments give the same envs,
observations, infos and Monitor files; composite spaces, per-env options and indices as SB3 has them. In-process
workers (``backend="serial"``), so that it stays cheap; ``benchmarks/sb3_peer.py`` runs SB3's own tests."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.monitor import Monitor, load_results  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from frugalrl.integrations.sb3 import ClusterSubprocVecEnv, make_sb3_vec_env  # noqa: E402

SPACES = OrderedDict(discrete=spaces.Discrete(3, start=1), multidiscrete=spaces.MultiDiscrete([2, 3]),
                     multibinary=spaces.MultiBinary(3), box=spaces.Box(-1, 1, (2,), dtype=np.float32))


class Echo(gym.Env):
    """Observes its last action (its first observation a seeded sample); three steps per episode; reset options
    are kept in ``options``, the step count is an info."""

    def __init__(self, space: gym.Space) -> None:
        self.observation_space = self.action_space = space
        self.options: Any = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t, self.options = 0, options
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        return action, float(self.t), self.t == 3, False, {"t": self.t}


def same(a: Any, b: Any) -> None:
    """``a`` and ``b`` are the same observation(s): equal arrays of equal dtypes, in equal dicts and tuples."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a, b)
        np.testing.assert_array_equal(a, b)


def play(venv: Any, actions: list[Any]) -> list[Any]:
    """Reset, then step with ``actions``: everything SB3 gets back (less the adapter's own info and the times)."""
    out = [venv.reset(), list(venv.reset_infos)]
    for a in actions:
        obs, rewards, dones, infos = venv.step(a)
        for info in infos:
            info.pop("frugalrl/bytes_total", None)
            if "episode" in info:
                info["episode"].pop("t")
        out += [obs, rewards, dones, infos]
    return out


@pytest.mark.parametrize("space", [spaces.Dict(SPACES), spaces.Tuple(tuple(SPACES.values())), *SPACES.values()],
                         ids=["dict", "tuple", *SPACES])
def test_composite_spaces_like_dummy_vec_env(space, closing):
    fns = [lambda: Monitor(Echo(space)) for _ in range(2)]
    venv = closing(ClusterSubprocVecEnv(fns, num_workers=1, backend="serial"))
    assert venv.observation_space == venv.action_space == space
    ref = DummyVecEnv(fns)
    space.seed(0)
    actions = [[space.sample() for _ in range(2)] for _ in range(4)]
    for vec_env in (venv, ref):
        vec_env.seed(5)
    for x, y in zip(play(venv, actions), play(ref, actions), strict=True):
        if isinstance(x, list) and x and isinstance(x[0], dict):  # infos
            for a, b in zip(x, y, strict=True):
                if "terminal_observation" in a:
                    same(a.pop("terminal_observation"), b.pop("terminal_observation"))
                assert a == b
        else:
            same(x, y)


class Steps(gym.Wrapper):
    """The step count as info ``extra`` (for Monitor's ``info_keywords``)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self.n = 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        obs, r, te, tr, info = self.env.step(action)
        self.n += 1
        return obs, r, te, tr, {**info, "extra": self.n}


def cartpole(**kwargs: Any) -> gym.Env:
    return Steps(gym.make("CartPole-v1", **kwargs))


def doubled(env: gym.Env) -> gym.Env:
    return gym.wrappers.TransformReward(env, lambda r: 2 * r)


def test_make_sb3_vec_env_is_make_vec_env(tmp_path, closing):
    """seed, start_index, monitor_dir, monitor_kwargs, env_kwargs, wrapper_class: same envs, same Monitor files."""
    kwargs = dict(seed=3, start_index=5, env_kwargs={"max_episode_steps": 9}, wrapper_class=doubled,
                  monitor_kwargs={"info_keywords": ("extra",)})
    ours = closing(make_sb3_vec_env(cartpole, 1, backend="serial", n_envs=2, monitor_dir=str(tmp_path / "ours"),
                                    **kwargs))
    ref = make_vec_env(cartpole, n_envs=2, monitor_dir=str(tmp_path / "ref"), **kwargs)
    actions = [np.array([t % 2, 1]) for t in range(20)]
    a, b = play(ours, actions), play(ref, actions)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, list):
            for i, j in zip(x, y, strict=True):
                i.pop("terminal_observation", None), j.pop("terminal_observation", None)
                assert i == j
        else:
            same(x, y)
    ours.close()
    files = sorted(p.name for p in (tmp_path / "ours").iterdir())
    assert files == ["5.monitor.csv", "6.monitor.csv"] == sorted(p.name for p in (tmp_path / "ref").iterdir())
    mine, theirs = load_results(str(tmp_path / "ours")), load_results(str(tmp_path / "ref"))
    assert list(mine.columns) == list(theirs.columns) and "extra" in mine.columns and len(mine) == len(theirs) >= 4
    assert sorted(zip(mine.r, mine.l, strict=True)) == sorted(zip(theirs.r, theirs.l, strict=True))  # unwrapped rewards
    assert (mine.r == mine.l).all() and (mine.extra == mine.l).all()
    with pytest.raises(ValueError, match="n_envs=3"):
        make_sb3_vec_env("CartPole-v1", 2, backend="serial", n_envs=3)


def test_subproc_vec_env_drop_in(closing):
    """As SB3's make_vec_env's vec_env_cls; per-env options and seeds; indices; per-env env_is_wrapped."""
    venv = closing(make_vec_env(lambda: Echo(spaces.Discrete(4)), n_envs=3, seed=0, vec_env_cls=ClusterSubprocVecEnv,
                                vec_env_kwargs={"num_workers": 1, "backend": "serial"}))
    ref = make_vec_env(lambda: Echo(spaces.Discrete(4)), n_envs=3, seed=0)
    same(venv.reset(), ref.reset())
    for vec_env in (venv, ref):
        vec_env.seed(7)
        vec_env._seeds[1] = 100
        vec_env.set_options([{"a": 1}, {}, {"b": [2]}])
    same(venv.reset(), ref.reset())
    assert venv.get_attr("options") == [{"a": 1}, None, {"b": [2]}] == ref.get_attr("options")
    assert venv.get_attr("t", indices=[-1, 0]) == [0, 0] == venv.env_method("get_wrapper_attr", "t", indices=[-1, 0])
    with pytest.raises(IndexError):
        venv.get_attr("t", indices=3)
    mixed = closing(ClusterSubprocVecEnv([lambda: Echo(spaces.Discrete(2)), lambda: Monitor(Echo(spaces.Discrete(2)))],
                                         start_method="spawn", backend="serial"))
    assert mixed.env_is_wrapped(Monitor) == [False, True] and mixed.cluster.num_workers == 2
    with pytest.raises(ValueError, match="cannot find context for 'nope'"):
        ClusterSubprocVecEnv([lambda: Echo(spaces.Discrete(2))], start_method="nope")


def test_make_sb3_vec_env_workers_do_not_import_torch(closing):
    """The workers build SB3's Monitor without Stable-Baselines3's package (whose ``__init__`` imports torch): on a
    plain env their processes never map libtorch (docs/benchmarks.md#worker-footprint)."""
    from pathlib import Path

    venv = closing(make_sb3_vec_env("CartPole-v1", 2, backend="local", n_envs=2, seed=0,
                                    vec_env_kwargs={"inline_workers": 0}))
    venv.reset()
    for _ in range(3):
        venv.step(np.zeros(2, dtype=np.int64))
    pids = venv.cluster.backend.worker_pids().values()
    assert len(pids) == 2 and not any("libtorch" in Path(f"/proc/{pid}/maps").read_text() for pid in pids)


def test_the_monitor_loaded_on_its_own_is_the_one_sb3_imports_later():
    """A worker loads SB3's monitor module from its file; a user's wrapper that imports Stable-Baselines3 afterwards
    in that process gets the same module and class (and torch only then)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from frugalrl.integrations.sb3_envs import sb3_monitor\n"
            "Monitor = sb3_monitor()\n"
            "assert 'torch' not in sys.modules and 'stable_baselines3' not in sys.modules\n"
            "from stable_baselines3.common.monitor import Monitor as Later\n"
            "import stable_baselines3.common.env_util as util\n"
            "assert Later is Monitor and util.Monitor is Monitor and 'torch' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
