"""MinAtar games (Young & Tian, 2019) as Gymnasium envs: ``frugalrl.envs.minatar:make_minatar``.

The ``minatar`` package (``pip install 'frugalrl[suite]'``) simulates five Atari games on a 10×10 grid;
an observation is 10×10×C booleans (C channels: paddle, ball, trail, bricks for Breakout), small enough
for an MLP. Actions are the game's minimal set. Episodes are capped at ``max_episode_steps`` (a
truncation), as Atari's are. The games draw their randomness from their own NumPy ``RandomState``, seeded
by ``reset(seed=...)``.

:class:`MinAtarEnv` runs a game as minatar's own Gymnasium env does (``minatar.gym.BaseEnv``: the same
observations, rewards and sticky actions for a seed), from the game's module alone: the minatar package's
``__init__`` imports seaborn, pandas, scipy and matplotlib for its display, about 1 s and 120 MB in every worker
process (docs/benchmarks.md#worker-footprint).

Importing this module also registers MinAtar's Gymnasium ids (``MinAtar/Breakout-v1``: the minimal action
set; ``-v0``: all six actions; no time limit) for :class:`MinAtarEnv`, where nothing registered them before:
``--env MinAtar/Breakout-v1`` reads as ``frugalrl.envs.minatar:MinAtar/Breakout-v1``
(:data:`frugalrl.envs.spec.NAMESPACE_MODULES`), so that every worker registers them too.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np

from frugalrl.lazy import import_without_package

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


def _game(game: str) -> Any:
    """The module of a MinAtar game (it imports numpy only), without the minatar package's ``__init__``."""
    if game not in GAMES:
        raise ValueError(f"unknown MinAtar game {game!r}; expected one of {GAMES}")
    if importlib.util.find_spec("minatar") is None:
        raise ImportError("MinAtar envs need the minatar package: pip install 'frugalrl[suite]'")
    return import_without_package(f"minatar.environments.{game}", alias=f"frugalrl.envs._minatar_{game}")


class MinAtarEnv(gym.Env):
    """One MinAtar game with minatar's ``BaseEnv`` interface and dynamics: the action is looked up in the action
    set, then repeated from the last step with probability ``sticky_action_prob`` (a draw every step, from the
    game's own ``RandomState``, which ``reset(seed=...)`` or :meth:`seed` replaces); observations are the game's bool
    grid. ``game`` is the game's own object (``BaseEnv.game`` is minatar's wrapper of it)."""

    metadata = {"render_modes": ["human", "array", "rgb_array"], "render_fps": 20}

    def __init__(self, game: str = "breakout", render_mode: str | None = None, display_time: int = 50,
                 use_minimal_action_set: bool = False, sticky_action_prob: float = 0.1,
                 difficulty_ramping: bool = True) -> None:
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.game_name = game
        self.game = _game(game).Env(ramping=difficulty_ramping)
        self.random = np.random.RandomState()  # the sticky actions' draws; the game's own until the first seed
        self.sticky_action_prob = float(sticky_action_prob)
        self.last_action = 0
        self.render_mode = render_mode
        self.display_time = int(display_time)
        self.action_set = list(self.game.minimal_action_set()) if use_minimal_action_set else list(range(6))
        self.action_space = gym.spaces.Discrete(len(self.action_set))
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=self.game.state_shape(), dtype=bool)

    def seed(self, seed: int | None = None) -> None:
        """One generator for the game and the sticky actions, as minatar's ``Environment.seed`` (None: unchanged)."""
        if seed is not None:
            self.random = self.game.random = np.random.RandomState(seed)

    def get_reset_state(self) -> dict[str, Any]:
        """What an unseeded :meth:`reset` starts an episode from besides ``np_random``, which this env does not draw
        from: the sticky actions' and the game's generators (one since the first seed), and the last action
        (minatar carries it into the next episode). A checkpoint records it to replay the episode
        (:mod:`frugalrl.envs.checkpoint`)."""
        shared = self.random is self.game.random
        return {"random": self.random.get_state(legacy=True),
                "game_random": None if shared else self.game.random.get_state(legacy=True),
                "last_action": int(self.last_action)}

    def set_reset_state(self, state: dict[str, Any]) -> None:
        """Put the env back in a :meth:`get_reset_state` state (as recorded, or through JSON)."""
        self.random = np.random.RandomState()
        self.random.set_state(_generator_state(state["random"]))
        if state["game_random"] is None:
            self.game.random = self.random
        else:
            self.game.random = np.random.RandomState()
            self.game.random.set_state(_generator_state(state["game_random"]))
        self.last_action = int(state["last_action"])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.seed(seed)
        self.game.reset()
        if self.render_mode == "human":
            self.render()
        return self.game.state(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = self.action_set[action]
        if self.random.rand() < self.sticky_action_prob:
            a = self.last_action
        self.last_action = a
        reward, done = self.game.act(a)
        if self.render_mode == "human":
            self.render()
        return self.game.state(), reward, done, False, {}

    def render(self) -> np.ndarray | None:
        """``array``: the grid; ``rgb_array``: each cell in the colour of its highest channel (seaborn's cubehelix
        palette, as minatar draws it); ``human``: that frame in a matplotlib window for ``display_time`` ms. The
        display libraries are imported here only."""
        if self.render_mode is None:
            gym.logger.warn("render() without a render_mode: make the env with render_mode='rgb_array' or 'human'")
            return None
        state = self.game.state()
        if self.render_mode == "array":
            return state
        import seaborn as sns

        palette = np.array([(0.0, 0.0, 0.0), *sns.color_palette("cubehelix", state.shape[-1])])
        frame = palette[np.amax(state * np.arange(1, state.shape[-1] + 1), axis=2)]
        if self.render_mode == "rgb_array":
            return frame
        from matplotlib import pyplot as plt

        plt.imshow(frame, interpolation="none")
        plt.pause(self.display_time / 1000)
        plt.cla()
        return None

    def __getstate__(self) -> dict[str, Any]:
        """Picklable: the game's class lives in a module loaded under a private name, so the game travels as its
        name and attributes (restored by :meth:`__setstate__`)."""
        state = dict(self.__dict__)
        state["game"] = dict(vars(state["game"]))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        game_cls = _game(state["game_name"]).Env
        game = game_cls.__new__(game_cls)
        game.__dict__.update(state["game"])
        self.__dict__.update({**state, "game": game})


def _generator_state(state: Any) -> tuple[Any, ...]:
    name, key, pos, has_gauss, cached = state
    return name, np.asarray(key, dtype=np.uint32), int(pos), int(has_gauss), float(cached)


def make_minatar(game: str = "breakout", max_episode_steps: int = 10_000, sticky_action_prob: float = 0.1,
                 render_mode: str | None = None) -> gym.Env:
    """One MinAtar game (``GAMES``) with its minimal action set, bool observations (10, 10, C) (``render_mode``:
    e.g. "rgb_array" for ``frugalrl eval --video``)."""
    env: gym.Env = MinAtarEnv(game, use_minimal_action_set=True, sticky_action_prob=sticky_action_prob,
                              render_mode=render_mode)
    return gym.wrappers.TimeLimit(env, max_episode_steps=int(max_episode_steps))


def register_ids() -> None:
    """Register ``MinAtar/<Game>-v0`` and ``-v1`` with Gymnasium for :class:`MinAtarEnv` (once; nothing without
    minatar, or where minatar's own ``register_envs`` registered them first)."""
    if "MinAtar/Breakout-v1" in gym.registry or importlib.util.find_spec("minatar") is None:
        return
    for game in GAMES:
        name = game.title().replace("_", "")
        for version, minimal in (("v0", False), ("v1", True)):
            gym.register(f"MinAtar/{name}-{version}", entry_point="frugalrl.envs.minatar:MinAtarEnv",
                         kwargs={"game": game, "use_minimal_action_set": minimal})


register_ids()
