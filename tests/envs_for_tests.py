"""Tiny real Gymnasium environments used by the tests (importable by worker processes).

They are deliberately small and deterministic; each one exists to drive one failure path of
ClusterEnv for real (no mocks): NaN observations or rewards, a constructor that raises, a worker
that hangs, a constructor that only fails inside a worker process.
"""

from __future__ import annotations

import mmap
import os
import signal
import time

import gymnasium as gym
import numpy as np


class CounterEnv(gym.Env):
    """Observation ``[t, seed_tag]`` (float32), Discrete(2) actions, reward 1, truncated after ``horizon``.

    The base class of the failure envs below.
    """

    metadata = {"render_modes": []}

    def __init__(self, horizon: int = 50) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.horizon = int(horizon)
        self.t = 0
        self.tag = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.tag], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.tag = float(self.np_random.integers(0, 1000))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= self.horizon, {}


class NaNObsEnv(CounterEnv):
    """Emits a NaN observation on step ``nan_after``."""

    def __init__(self, nan_after: int = 3, horizon: int = 50) -> None:
        super().__init__(horizon)
        self.nan_after = int(nan_after)

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        if self.t >= self.nan_after:
            obs = np.array([np.nan, 0.0], dtype=np.float32)
        return obs, r, te, tr, info


class OldAPIEnv(CounterEnv):
    """A CounterEnv that breaks Gymnasium's API after ``after`` steps: ``reset`` returns only the observation (the old
    Gym API's), ``step`` four values (``done`` for terminated and truncated), or a reward that is an array."""

    def __init__(self, broken: str = "reset", after: int = 2) -> None:
        super().__init__()
        self.broken, self.after = broken, int(after)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs if self.broken == "reset" else (obs, info)

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        if self.t < self.after:
            return obs, r, te, tr, info
        if self.broken == "step":
            return obs, r, te or tr, info
        return obs, np.array([r]), te, tr, info


class NaNRewardEnv(CounterEnv):
    """Emits a NaN reward on step ``nan_after``."""

    def __init__(self, nan_after: int = 3, horizon: int = 50) -> None:
        super().__init__(horizon)
        self.nan_after = int(nan_after)

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        if self.t >= self.nan_after:
            r = float("nan")
        return obs, r, te, tr, info


def raising_factory(**kwargs):
    """An env factory whose construction always fails."""
    raise RuntimeError("boom: this environment cannot be built")


class FailsInWorkerEnv(CounterEnv):
    """Builds in the process ``head_pid`` (the test) and raises in any other process (a worker)."""

    def __init__(self, head_pid: int) -> None:
        super().__init__()
        if os.getpid() != int(head_pid):
            raise RuntimeError("boom: this environment refuses to start in a worker process")


class DiesWhileStartingEnv(CounterEnv):
    """Builds in the process ``head_pid`` (the test); a worker process building it dies at once (SIGKILL, as
    the OOM killer would), the first time only when ``marker`` (a file path) is given, else every time."""

    def __init__(self, head_pid: int, marker: str | None = None) -> None:
        super().__init__()
        if os.getpid() != int(head_pid) and (marker is None or _first_to_create(marker)):
            os.kill(os.getpid(), signal.SIGKILL)


class DiesAfterEnv(CounterEnv):
    """In a worker process (not ``head_pid``): the first process to build it (it creates ``marker``) is SIGKILLed at
    its step ``die_after``, every later one at its first step, as a worker whose node keeps failing."""

    def __init__(self, head_pid: int, marker: str, die_after: int = 100) -> None:
        super().__init__(horizon=10)
        in_worker = os.getpid() != int(head_pid)
        self.die_at = None if not in_worker else (int(die_after) if _first_to_create(marker) else 1)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.die_at is not None and self.steps >= self.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class RaisesOnceEnv(CounterEnv):
    """Raises at its step ``raise_at`` in the first process that gets there (it creates ``marker``), as a simulator
    that turns unstable once in a long run; every later env steps normally."""

    def __init__(self, marker: str, raise_at: int = 100) -> None:
        super().__init__(horizon=10)
        self.marker, self.raise_at, self.steps = marker, int(raise_at), 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.raise_at and _first_to_create(self.marker):
            raise RuntimeError(f"simulation unstable at step {self.steps}")
        return super().step(action)


_LEAKED: list[mmap.mmap] = []


class LeakyEnv(CounterEnv):
    """Keeps ``leak_kb`` KiB of written memory per step for the life of its process, as a leaking simulator: in new
    anonymous mappings, so that resident memory grows in any process (a heap with free space, e.g. a test process
    after many tests, would take a leak from the heap without growing)."""

    def __init__(self, leak_kb: int = 1024) -> None:
        super().__init__()
        self.leak = int(leak_kb) * 1024

    def step(self, action):
        pages = mmap.mmap(-1, self.leak)
        pages.write(b"\x01" * self.leak)
        _LEAKED.append(pages)
        return super().step(action)


def _first_to_create(path: str) -> bool:
    """Create ``path``; whether this process did (of several starting together, exactly one does)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class HangingEnv(CounterEnv):
    """``step`` number ``hang_after`` sleeps (practically) forever.

    With ``marker`` (a file path) it hangs only once per marker: the first process to hang creates
    the file, and replacements built later step normally.
    """

    def __init__(self, hang_after: int = 5, marker: str | None = None, horizon: int = 50) -> None:
        super().__init__(horizon)
        self.hang_after = int(hang_after)
        self.marker = marker
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps >= self.hang_after:
            if self.marker is None:
                time.sleep(3600)
            elif not os.path.exists(self.marker):
                with open(self.marker, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(3600)
        return super().step(action)


class MultiDiscreteEnv(CounterEnv):
    """A CounterEnv with a two-dimensional MultiDiscrete action space (which frugalrl's agents do not act in)."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.MultiDiscrete([[2, 3], [2, 2]])


class MatchEnv(gym.Env):
    """Say the target back: each step shows a random target (one-hot per sub-action, or bits) and pays the share of
    the action's parts that match it. MultiDiscrete(``nvec``) actions (Discrete for one ``nvec``), from ``start``, or
    MultiBinary(``bits``) with ``bits``; ``horizon`` steps an episode, so a perfect policy returns ``horizon`` and a
    random one ``horizon * mean(1 / nvec)`` (half of it for bits)."""

    def __init__(self, nvec: tuple[int, ...] = (3, 4, 2), bits: int = 0, horizon: int = 8, start: int = 0) -> None:
        self.nvec = [int(n) for n in nvec]
        self.bits, self.horizon, self.start = int(bits), int(horizon), int(start)
        if self.bits:
            self.action_space: gym.Space = gym.spaces.MultiBinary(self.bits)
            size = self.bits
        else:
            self.action_space = (gym.spaces.Discrete(self.nvec[0], start=self.start) if len(self.nvec) == 1 else
                                 gym.spaces.MultiDiscrete(self.nvec, start=[self.start] * len(self.nvec)))
            size = sum(self.nvec)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)
        self.t = 0

    def _draw(self) -> np.ndarray:
        if self.bits:
            self.target = self.np_random.integers(0, 2, self.bits)
            return self.target.astype(np.float32)
        self.target = np.array([self.np_random.integers(0, n) for n in self.nvec])
        obs = np.zeros(sum(self.nvec), np.float32)
        obs[np.cumsum([0, *self.nvec[:-1]]) + self.target] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, dtype=self.action_space.dtype)), action
        reward = float(np.mean(np.asarray(action) - self.start == self.target))
        self.t += 1
        return self._draw(), reward, False, self.t >= self.horizon, {}


class MatrixActionEnv(gym.Env):
    """Box actions of ``shape`` ((2, 3) by default; () a scalar), one bound infinite: each step pays
    ``-sum((action - 0.5)²)``; 8 steps an episode, so the best policy returns 0 and one that acts 0 returns −12 (for
    (2, 3))."""

    def __init__(self, shape: tuple[int, ...] = (2, 3)) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Box(-2.0, np.inf, tuple(shape), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, dtype=np.float32)), action
        self.t += 1
        reward = -float(np.square(action - 0.5).sum())
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), reward, False, self.t >= 8, {}


class TextObservationEnv(CounterEnv):
    """A CounterEnv whose observation space is Text (which Gymnasium cannot flatten, so no agent takes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Text(8)


class InfoKindsEnv(CounterEnv):
    """A CounterEnv whose infos hold every kind of value Gymnasium batches: numbers, arrays, strings, None, lists,
    numpy booleans, nested dicts (of all of these, an int key too), a key that looks like a JSON list and, only with
    ``with_object``, an object; with ``ragged``, an array whose length differs between envs."""

    def __init__(self, horizon: int = 4, with_object: bool = False, ragged: bool = False) -> None:
        super().__init__(horizon)
        self.with_object, self.ragged = with_object, ragged

    def _info(self) -> dict:
        info = {"count": self.t, "pos": np.full(2, self.t / 2), "stage": f"stage-{self.t % 3}", "none": None,
                "trail": [self.t, "x"], "flag": np.bool_(self.t % 2), "[odd]": 1.5,
                "nested": {"a": self.t, "b": np.float32(0.5), "c": "y", "v": np.arange(3, dtype=np.int16),
                           "flag": np.bool_(True), 7: "int key", "deeper": {"d": self.t * 2}}}
        if self.t == 2:
            info["sometimes"] = "two"
        if self.with_object:
            info["handle"] = object()
        if self.ragged:  # an array whose length differs between envs (their tags differ)
            info["path"] = np.zeros(int(self.tag) % 7 + 1)
        return info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, _ = super().reset(seed=seed, options=options)
        return obs, {**self._info(), "at_reset": "yes"}

    def step(self, action):
        obs, reward, term, trunc, _ = super().step(action)
        return obs, reward, term, trunc, self._info()


# Registered on import, for the "module:EnvId" convention (gym.make imports the module, then finds the id).
gym.register("FrugalCounter-v0", entry_point=CounterEnv, kwargs={"horizon": 7})


class RaisesOnResetEnv(CounterEnv):
    """Builds in the process ``head_pid`` (the test); in any other (a worker) every ``reset()`` raises, as a
    simulator whose licence server is gone."""

    def __init__(self, head_pid: int) -> None:
        super().__init__()
        self.in_worker = os.getpid() != int(head_pid)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self.in_worker:
            raise ConnectionError("licence server unreachable")
        return super().reset(seed=seed, options=options)


class RaisesEveryEnv(CounterEnv):
    """Raises at its every ``raise_every``-th step of its life, as an env that fails now and then for good."""

    def __init__(self, raise_every: int = 30) -> None:
        super().__init__(horizon=10)
        self.raise_every, self.steps = int(raise_every), 0

    def step(self, action):
        self.steps += 1
        if self.steps % self.raise_every == 0:
            raise RuntimeError(f"simulation unstable at step {self.steps}")
        return super().step(action)


class RaisesInEvaluationEnv(CounterEnv):
    """Raises at step 5 of an episode reset with a seed of 10,000 or more (a run's evaluation episodes: EVAL_SEED),
    as an env whose rare states only a deterministic policy reaches; training episodes step normally."""

    def __init__(self) -> None:
        super().__init__(horizon=10)
        self.evaluating = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.evaluating = seed >= 10_000
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.evaluating and self.t == 4:
            raise RuntimeError("rare state reached")
        return super().step(action)


class DiesOnceEnv(CounterEnv):
    """In a worker process (not ``head_pid``): the first env to reach its step ``die_at`` (it creates ``marker``)
    SIGKILLs its process, as the OOM killer would once in a long run; every other env steps normally."""

    def __init__(self, head_pid: int, marker: str, die_at: int = 100) -> None:
        super().__init__(horizon=10)
        self.in_worker = os.getpid() != int(head_pid)
        self.marker, self.die_at, self.steps = marker, int(die_at), 0

    def step(self, action):
        self.steps += 1
        if self.in_worker and self.steps == self.die_at and _first_to_create(self.marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class CannotStartAgainEnv(CounterEnv):
    """In a worker process (not ``head_pid``): raises at its step 5 and creates ``marker``; a later one cannot even
    be built once ``marker`` exists, as a simulator whose licence server went down."""

    def __init__(self, head_pid: int, marker: str) -> None:
        super().__init__()
        self.in_worker, self.marker = os.getpid() != int(head_pid), marker
        if self.in_worker and os.path.exists(marker):
            raise ConnectionError("licence server unreachable")

    def step(self, action):
        if self.in_worker and self.t == 4 and _first_to_create(self.marker):
            raise RuntimeError("licence lost mid-run")
        return super().step(action)
