"""Atari environments with the standard DQN/IMPALA preprocessing, as a ClusterEnv factory.

``frugalrl.envs.atari:make_atari`` builds ``ALE/<Game>-v5`` (ROMs ship with ale-py; or ``<Game>NoFrameskip-v4``)
with no frame skip in the emulator, then Gymnasium's ``AtariPreprocessing`` (no-op starts, frame skip 4 with
max-pooling, 84x84 grayscale) and a stack of the last 4 frames: observations are ``(4, 84, 84)`` uint8. Sticky
actions are the id's own: 0.25 for v5, none for v4.
"""

from __future__ import annotations

import gymnasium as gym


def make_atari(
    env_id: str = "ALE/Pong-v5",
    frame_stack: int = 4,
    frame_skip: int = 4,
    screen_size: int = 84,
    noop_max: int = 30,
    terminal_on_life_loss: bool = False,
    max_episode_steps: int | None = 27_000,
    render_mode: str | None = None,
) -> gym.Env:
    """One preprocessed Atari env; raises a clear error if ale-py is missing or the game is unknown
    (``render_mode``: the game's, e.g. "rgb_array" for ``frugalrl eval --video``)."""
    try:
        import ale_py
    except ImportError as e:  # pragma: no cover - ale-py is a dependency
        raise ImportError("Atari environments need ale-py: pip install ale-py") from e
    gym.register_envs(ale_py)
    try:
        env = gym.make(env_id, frameskip=1, max_episode_steps=max_episode_steps, render_mode=render_mode)
    except gym.error.Error as e:
        raise ValueError(f"unknown Atari game {env_id!r}: {e}") from e
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        terminal_on_life_loss=terminal_on_life_loss,
        grayscale_obs=True,
    )
    return gym.wrappers.FrameStackObservation(env, frame_stack)


def ale_reset_state(env: gym.Env) -> str:
    """What an unseeded reset of the ALE env ``env`` (its ``unwrapped``) starts an episode from besides
    ``np_random``: the emulator's state with its random generator (sticky actions), serialised by ALE and
    compressed, as base64 text (~10 kB), for a checkpoint to replay the episode
    (:func:`frugalrl.experience.start_state`)."""
    import base64
    import zlib

    ale = env.unwrapped.ale  # type: ignore[attr-defined]
    return base64.b64encode(zlib.compress(ale.cloneState(include_rng=True).serialize())).decode()


def set_ale_reset_state(env: gym.Env, state: str) -> None:
    """Put the ALE env ``env`` back in an :func:`ale_reset_state` state (ALE's own decoder, no pickle)."""
    import base64
    import zlib

    import ale_py

    data = zlib.decompress(base64.b64decode(state))
    env.unwrapped.ale.restoreState(ale_py.ALEState(data))  # type: ignore[attr-defined]
