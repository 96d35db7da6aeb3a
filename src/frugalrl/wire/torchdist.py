"""Byte messages between two ranks of a ``torch.distributed`` process group, every byte counted.

The split-model pipeline (:mod:`frugalrl.pipeline`) moves activations, gradients, actions and rewards
between its two stages as *cut messages* (:mod:`frugalrl.wire.cut`): self-describing byte strings with
a small binary header. A :class:`TorchDistChannel` sends one such message as an int64 length followed by
the bytes as a uint8 tensor (gloo on CPU; NCCL needs device tensors and is not used for these small
point-to-point messages), and records both in a :class:`~frugalrl.wire.meter.ByteMeter`:
the message body under its kind (``activations``, ``gradients``, ...), its header and the length
prefix under ``control``. Nothing is pickled: ``dist.send_object``/``broadcast_object_list`` are never
used, and a stage only ever parses the binary cut format or UTF-8 JSON.

Directions follow the rest of frugalrl: ``up`` is stage 0 → stage 1 (the stage with the environment
plays the worker), ``down`` is stage 1 → stage 0.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.distributed as dist

from frugalrl.wire.cut import cut_info, header_nbytes
from frugalrl.wire.meter import DOWN, UP, ByteMeter

LENGTH_PREFIX_BYTES = 8
"""Every message is preceded by its length as one int64."""
MAX_MESSAGE_BYTES = 1 << 31
"""A length above this is taken as a corrupt stream rather than allocated."""


class TorchDistChannel:
    """Point-to-point messages between this rank and ``peer``, counted in ``meter``.

    ``rank`` 0 sends ``up`` and receives ``down``; any other rank the reverse. ``wait_seconds``
    accumulates the time spent blocked in :meth:`recv` (the communication wait of a pipeline stage).
    """

    def __init__(self, rank: int, peer: int, meter: ByteMeter | None = None) -> None:
        self.rank = rank
        self.peer = peer
        self.meter = meter if meter is not None else ByteMeter()
        self.out_dir, self.in_dir = (UP, DOWN) if rank == 0 else (DOWN, UP)
        self.wait_seconds = 0.0
        self.messages = 0
        self.device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")

    def _count(self, buf: bytes | memoryview, kind: str, direction: str, cut: bool) -> None:
        header = header_nbytes(len(cut_info(buf)["shape"])) if cut else 0
        self.meter.add(kind, len(buf) - header, direction=direction)
        self.meter.add("control", header + LENGTH_PREFIX_BYTES, direction=direction)
        self.messages += 1

    def send(self, buf: bytes, kind: str, cut: bool = True) -> None:
        """Send one message of ``kind`` (a cut message unless ``cut=False``: then all of it is ``kind``)."""
        self._count(buf, kind, self.out_dir, cut)
        dist.send(torch.tensor([len(buf)], dtype=torch.int64, device=self.device), self.peer)
        if buf:
            dist.send(torch.frombuffer(bytearray(buf), dtype=torch.uint8).to(self.device), self.peer)

    def recv(self, kind: str, cut: bool = True) -> memoryview:
        """Receive the next message from the peer (blocking); ``kind`` is what it is counted as."""
        start = time.perf_counter()
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.recv(length, self.peer)
        n = int(length.item())
        if not 0 <= n <= MAX_MESSAGE_BYTES:
            raise ValueError(f"rank {self.rank}: peer {self.peer} announced a message of {n} bytes; stream is corrupt")
        data = torch.empty(n, dtype=torch.uint8, device=self.device)
        if n:
            dist.recv(data, self.peer)
        self.wait_seconds += time.perf_counter() - start
        buf = data.cpu().numpy().data  # a memoryview of the fresh receive buffer itself, no copy
        self._count(buf, kind, self.in_dir, cut)
        return buf

    def send_json(self, obj: Any) -> None:
        """Send a small JSON document (counted as ``control``)."""
        self.send(json.dumps(obj, sort_keys=True).encode(), "control", cut=False)

    def recv_json(self) -> Any:
        """Receive a JSON document sent by :meth:`send_json`; a clear error if it is not JSON."""
        buf = self.recv("control", cut=False)
        try:
            return json.loads(bytes(buf).decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"rank {self.rank}: expected a JSON control message from rank {self.peer}: {e}") from e
