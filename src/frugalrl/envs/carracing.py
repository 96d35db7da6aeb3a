"""CarRacing-v3 as the pipeline-PPO paper uses it: 4 stacked 96x96 grayscale frames.

``frugalrl.envs.carracing:make_car_racing`` builds ``CarRacing-v3`` (continuous actions: steering in
[-1, 1], gas and brake in [0, 1]), converts each RGB frame to grayscale and stacks the last
``frame_stack`` frames: observations are ``(4, 96, 96)`` uint8, the 36,864 input dimensions of the
paper's Section III. ``frame_skip > 1`` repeats each action (summing rewards), a common speed-up that
the paper does not use (default 1).
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym


class _ActionRepeat(gym.Wrapper):
    """Repeat each action ``k`` times, summing the rewards (stops early when the episode ends)."""

    def __init__(self, env: gym.Env, k: int) -> None:
        super().__init__(env)
        self.k = k

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        total = 0.0
        for _ in range(self.k):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def make_car_racing(frame_stack: int = 4, frame_skip: int = 1, max_episode_steps: int | None = None,
                    render_mode: str | None = None) -> gym.Env:
    """One preprocessed CarRacing-v3 env: grayscale, ``frame_stack`` frames, optional action repeat
    (``render_mode``: the env's, e.g. "rgb_array" for ``frugalrl eval --video``)."""
    if frame_stack < 1 or frame_skip < 1:
        raise ValueError(f"frame_stack and frame_skip must be >= 1, got {frame_stack}, {frame_skip}")
    kwargs: dict[str, Any] = {} if max_episode_steps is None else {"max_episode_steps": int(max_episode_steps)}
    env = gym.make("CarRacing-v3", continuous=True, render_mode=render_mode, **kwargs)
    if frame_skip > 1:
        env = _ActionRepeat(env, frame_skip)
    env = gym.wrappers.GrayscaleObservation(env, keep_dim=False)
    return gym.wrappers.FrameStackObservation(env, frame_stack)
