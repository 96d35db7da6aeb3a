"""Video of a trained policy: ``frugalrl eval RUN --video agent.mp4`` (or ``.gif``).

The episodes are those of the evaluation (:func:`frugalrl.evaluation.play`, the same env seeds and actions), played
on envs built with ``render_mode="rgb_array"`` and written one after another into one file, each frame as the env
renders it after its reset and after each step: what CleanRL's ``--capture-video`` and rl-zoo's ``record_video``
give, without their extra dependency (an MP4 through OpenCV, which frugalrl installs for Atari; a GIF through
Pillow, which matplotlib installs).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from frugalrl.envs.spec import EnvSpec
from frugalrl.evaluation import Evaluation, PolicyEvaluator, Poll, play

FORMATS = (".mp4", ".gif")
"""The files a video can be written to, by suffix."""


class Frames:
    """Frames written to ``path`` as they come (MP4), or kept and written at :meth:`close` (GIF), at ``fps``."""

    def __init__(self, path: Path, fps: float) -> None:
        self.path, self.fps, self.count = path, float(fps), 0
        self._writer: Any = None
        self._kept: list[np.ndarray] = []

    def add(self, frame: Any) -> None:
        """One RGB frame ``(H, W, 3)`` uint8, as ``env.render()`` returns it in ``rgb_array`` mode."""
        if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[2] == 3):
            got = "None" if frame is None else f"{type(frame).__name__} {getattr(frame, 'shape', '')}".strip()
            raise ValueError(f"the env's render() gave {got}, not an RGB frame (H, W, 3): it cannot be recorded")
        frame = np.ascontiguousarray(frame, dtype=np.uint8)
        if self.path.suffix == ".gif":
            self._kept.append(frame)
        else:
            import cv2

            if self._writer is None:
                size = (frame.shape[1], frame.shape[0])
                self._writer = cv2.VideoWriter(str(self.path), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, size)
                if not self._writer.isOpened():
                    raise OSError(f"OpenCV could not open {self.path} for writing")
                self._size = size
            if (frame.shape[1], frame.shape[0]) != self._size:
                frame = cv2.resize(frame, self._size)  # an env whose frames change size: the first one's
            self._writer.write(frame[:, :, ::-1])  # OpenCV writes BGR
        self.count += 1

    def close(self) -> None:
        """Finish the file (a GIF is written now)."""
        if self._writer is not None:
            self._writer.release()
        if self._kept:
            from PIL import Image

            images = [Image.fromarray(f) for f in self._kept]
            images[0].save(self.path, save_all=True, append_images=images[1:], duration=round(1000 / self.fps),
                           loop=0)


def record(evaluator: PolicyEvaluator, path: str | Path, poll: Poll | None = None) -> tuple[Evaluation, int]:
    """Play ``evaluator``'s episodes on envs that render frames and write them to ``path`` (``.mp4`` or ``.gif``);
    return the evaluation (the same as without the video) and the number of frames written."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"--video {path}: a video is written as {' or '.join(FORMATS)}")
    if not path.parent.is_dir():
        raise ValueError(f"--video {path}: the directory {path.parent} does not exist")
    spec, fps = rendering(evaluator.env_spec)
    frames = Frames(path, fps)
    try:
        returns, cut = play(evaluator.agent, spec, evaluator.episodes, evaluator.seed, evaluator.deterministic,
                            evaluator.max_steps, poll, seen=lambda env: frames.add(env.render()))
    finally:
        frames.close()
    mean, std = float(np.mean(returns)), float(np.std(returns))
    return Evaluation(mean, std, evaluator.episodes, evaluator.deterministic, returns, cut), frames.count


def rendering(spec: EnvSpec) -> tuple[EnvSpec, float]:
    """``spec`` whose envs render RGB frames (``render_mode="rgb_array"`` for ``gym.make`` or the factory) and their
    frame rate (the env's ``render_fps``, else 30); a ``ValueError`` naming the env if it does not take that mode."""
    if spec.fns is not None:
        raise ValueError("a video needs an env id or factory, which it builds with render_mode='rgb_array'")
    rendered = dataclasses.replace(spec, kwargs={**spec.kwargs, "render_mode": "rgb_array"})
    try:
        env = rendered.make()
    except (TypeError, gym.error.Error) as e:
        raise ValueError(f"{spec.describe()} does not take render_mode='rgb_array' ({e}): it cannot be recorded") from e
    try:
        mode, fps = getattr(env, "render_mode", None), float(env.metadata.get("render_fps") or 30)
    finally:
        env.close()
    if mode != "rgb_array":
        raise ValueError(f"{spec.describe()} was built with render_mode='rgb_array' but renders {mode!r}: it cannot be "
                         "recorded")
    return rendered, fps
