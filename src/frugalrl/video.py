"""Video of a trained policy: ``frugalrl eval RUN --video agent.mp4`` (or ``.gif``).

The episodes are those of the evaluation (:func:`frugalrl.evaluation.play`, the same env seeds and actions), played
on envs built with ``render_mode="rgb_array"`` and written one after another into one file, each frame as the env
renders it after its reset and after each step: what CleanRL's ``--capture-video`` and rl-zoo's ``record_video``
give, without their extra dependency (an MP4 through OpenCV, which frugalrl installs for Atari; a GIF through
Pillow, which matplotlib installs).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from frugalrl.envs.spec import EnvSpec
from frugalrl.evaluation import Evaluation, PolicyEvaluator, Poll

FORMATS = (".mp4", ".gif")
"""The files a video can be written to, by suffix."""

MIN_SIDE = 160
"""Frames smaller than this (MinAtar's 10 × 10 grid) are scaled up by a whole factor, each cell a block of pixels."""

GIF_MAX_BYTES = 1 << 30
"""The most a GIF keeps in memory before it is written (a byte a pixel): ten MuJoCo episodes of 480 × 480 frames
would take 2.3 GB, so such a recording stops with a :class:`VideoError` that says to write an MP4 instead."""


class VideoError(ValueError):
    """A video that cannot be made: its file, or an env that does not render RGB frames."""


class Frames:
    """Frames written to ``path`` as they come (MP4), or kept in memory as palette images, a byte a pixel, and
    written at :meth:`close` (GIF: for short videos, up to :data:`GIF_MAX_BYTES`), at ``fps``. Until then the file
    is a temporary one of its own beside ``path``."""

    def __init__(self, path: Path, fps: float) -> None:
        self.path, self.fps, self.count = path, float(fps), 0
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
        os.close(fd)
        self.tmp = Path(name)
        self._writer: Any = None
        self._size: tuple[int, int] | None = None
        self._kept: list[Any] = []

    def add(self, frame: Any) -> None:
        """One RGB frame ``(H, W, 3)`` as ``env.render()`` returns it in ``rgb_array`` mode (uint8, or floats in
        [0, 1])."""
        if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[2] == 3 and frame.size):
            got = "None" if frame is None else f"{type(frame).__name__} {getattr(frame, 'shape', '')}".strip()
            raise VideoError(f"the env's render() gave {got}, not an RGB frame (H, W, 3): it cannot be recorded")
        if frame.dtype.kind == "f":
            frame = np.clip(np.nan_to_num(frame * 255.0 if np.nanmax(frame) <= 1.0 else frame), 0, 255)
        frame = np.ascontiguousarray(frame, dtype=np.uint8)
        scale = -(-MIN_SIDE // min(frame.shape[:2]))
        if scale > 1:
            frame = frame.repeat(scale, axis=0).repeat(scale, axis=1)
        size = (frame.shape[1], frame.shape[0])
        if self._size is None:
            self._size = size
        elif size != self._size:  # an env whose frames change size: the first one's
            import cv2

            frame = cv2.resize(frame, self._size)
        if self.path.suffix == ".gif":
            from PIL import Image

            if (self.count + 1) * self._size[0] * self._size[1] > GIF_MAX_BYTES:
                raise VideoError(
                    f"--video {self.path}: a GIF is kept in memory until it is written, and {self.count + 1} frames "
                    f"of {self._size[0]} × {self._size[1]} exceed {GIF_MAX_BYTES / 2**30:g} GiB; write an .mp4 "
                    "(its frames go to disk as they come) or play fewer --eval-episodes")
            self._kept.append(Image.fromarray(frame).quantize())  # a byte a pixel
        else:
            if self._writer is None:
                import cv2

                self._writer = cv2.VideoWriter(str(self.tmp), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, self._size)
                if not self._writer.isOpened():
                    raise VideoError(f"OpenCV could not open {self.tmp} for writing")
            self._writer.write(frame[:, :, ::-1])  # OpenCV writes BGR
        self.count += 1

    def close(self, keep: bool) -> None:
        """Finish the file and put it at ``path`` (``keep``), or remove what was written (a failure)."""
        try:
            if self._writer is not None:
                self._writer.release()
            if keep and self._kept:
                # browsers play GIF frames shorter than 20 ms at 100 ms: a faster env's video plays slower
                duration = max(20, round(1000 / self.fps))
                self._kept[0].save(self.tmp, save_all=True, append_images=self._kept[1:], duration=duration, loop=0)
            if keep and self.count:
                os.replace(self.tmp, self.path)
        except OSError as e:
            if keep:  # else the failure that ended the recording is the one to see
                raise VideoError(f"--video {self.path}: {e}") from e
        finally:
            self.tmp.unlink(missing_ok=True)


def record(evaluator: PolicyEvaluator, path: str | Path, poll: Poll | None = None) -> tuple[Evaluation, int]:
    """Play ``evaluator``'s episodes on envs that render frames and write them to ``path`` (``.mp4`` or ``.gif``);
    return the evaluation (the same as without the video) and the number of frames written. :class:`VideoError` for
    a path or an env it cannot do."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise VideoError(f"--video {path}: a video is written as {' or '.join(FORMATS)}")
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK) or path.is_dir():
        raise VideoError(f"--video {path}: not a file that can be written (is {path.parent} a writable directory?)")
    spec, fps = rendering(evaluator.env_spec)
    frames = Frames(path, fps)
    done = False
    try:
        played = dataclasses.replace(evaluator, env_spec=spec)(poll=poll, seen=lambda env: frames.add(env.render()))
        done = True
    finally:
        frames.close(keep=done)
    return played, frames.count


def rendering(spec: EnvSpec) -> tuple[EnvSpec, float]:
    """``spec`` whose envs render RGB frames (``render_mode="rgb_array"`` for ``gym.make`` or the factory) and their
    frame rate (the env's ``render_fps``, else 30); a :class:`VideoError` naming the env if it does not take that
    mode."""
    if spec.fns is not None:
        raise VideoError("a video needs an env id or factory, which it builds with render_mode='rgb_array'")
    rendered = dataclasses.replace(spec, kwargs={**spec.kwargs, "render_mode": "rgb_array"})
    try:
        env = rendered.make()
    except (TypeError, gym.error.Error) as e:
        raise VideoError(f"{spec.describe()} does not take render_mode='rgb_array' ({e}): it cannot be recorded") from e
    try:
        mode, fps = getattr(env, "render_mode", None), float(env.metadata.get("render_fps") or 30)
    finally:
        env.close()
    if mode != "rgb_array":
        raise VideoError(f"{spec.describe()} was built with render_mode='rgb_array' but renders {mode!r}: it cannot be "
                         "recorded")
    return rendered, fps
