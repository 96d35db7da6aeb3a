"""The process's global random generators as a run's checkpoint sees them.

A resumed run must draw what the uninterrupted run would have drawn: :func:`rng_state` captures torch's, NumPy's
and Python's global generators in types a checkpoint holds without pickle surprises, :func:`set_rng_state` puts
them back, and :class:`GeneratorState` makes a ``torch.Generator`` of an algorithm's own a checkpoint part.
"""

from __future__ import annotations

import random
import typing
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed torch, NumPy's global generator and Python's ``random``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def rng_state() -> dict[str, Any]:
    """The global RNG states of torch, NumPy and Python (checkpoint-safe types only)."""
    kind, keys, pos, has_gauss, gauss = typing.cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    return {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                                                     gauss], "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


class GeneratorState:
    """A ``torch.Generator`` as a checkpoint part."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state_dict(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
