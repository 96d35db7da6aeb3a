"""MinAtar games (Young & Tian, 2019) as Gymnasium envs: ``frugalrl.envs.minatar:make_minatar``.

The ``minatar`` package (``pip install 'frugalrl[suite]'``) simulates five Atari games on a 10×10 grid;
an observation is 10×10×C booleans (C channels: paddle, ball, trail, bricks for Breakout), small enough
for an MLP. Actions are the game's minimal set. Episodes are capped at ``max_episode_steps`` (a
truncation), as Atari's are. The games draw their randomness from their own NumPy ``RandomState``, seeded
by ``reset(seed=...)``.

Importing this module also registers MinAtar's own Gymnasium ids (``MinAtar/Breakout-v1``: the minimal action
set; ``-v0``: all six actions; no time limit), which the minatar package defines but registers only when asked:
``--env MinAtar/Breakout-v1`` reads as ``frugalrl.envs.minatar:MinAtar/Breakout-v1``
(:data:`frugalrl.envs.spec.NAMESPACE_MODULES`), so that every worker registers them too.
"""

from __future__ import annotations

import gymnasium as gym

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


def make_minatar(game: str = "breakout", max_episode_steps: int = 10_000, sticky_action_prob: float = 0.1) -> gym.Env:
    """One MinAtar game (``GAMES``) with its minimal action set, bool observations (10, 10, C)."""
    if game not in GAMES:
        raise ValueError(f"unknown MinAtar game {game!r}; expected one of {GAMES}")
    try:
        from minatar.gym import BaseEnv
    except ImportError as e:
        raise ImportError(f"MinAtar envs need the minatar package: pip install 'frugalrl[suite]' ({e})") from e
    env: gym.Env = BaseEnv(game, use_minimal_action_set=True, sticky_action_prob=sticky_action_prob)
    return gym.wrappers.TimeLimit(env, max_episode_steps=int(max_episode_steps))


def register_ids() -> None:
    """Register MinAtar's ``MinAtar/<Game>-v0`` and ``-v1`` ids with Gymnasium (once; nothing without minatar)."""
    if "MinAtar/Breakout-v1" in gym.registry:
        return
    try:
        from minatar.gym import register_envs
    except ImportError:
        return
    register_envs()


register_ids()
