"""Messages: the one envelope for everything that crosses a process or machine boundary.

A message is an operation name, a small JSON ``meta`` dict and named NumPy arrays. It is
encoded as::

    b"FRL1" | u32 header length | JSON header | payload bytes of each array, in order

The header lists each array's name, dtype and shape, plus its codec and byte-meter kind where
they differ from the defaults (``raw``, and the kind implied by the name).
A payload's size is a function of shape, dtype and codec, except for the compressing codecs (``lz4``,
``zstd``), whose payloads carry their own length; sizes by kind are always those of the bytes produced.
Nothing is pickled, so a message from an untrusted peer can at worst fail to decode.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frugalrl.wire import codecs

MAGIC = b"FRL1"
_PREFIX = struct.Struct("<4sI")

_KIND_BY_NAME = {
    "obs": "observations",
    "next_obs": "observations",
    "final_obs": "observations",
    "final_idx": "control",
    "actions": "actions",
    "rewards": "rewards",
    "terminations": "rewards",
    "truncations": "rewards",
    "dist_params": "behaviour",
    "behaviour_logp": "behaviour",
}


class WireError(RuntimeError):
    """A message could not be decoded (corrupt, truncated, or not a frugalrl message)."""


def default_kind(name: str) -> str:
    """The byte-meter kind of an array named ``name`` (``w/...`` and deltas ``wd/...`` are weights, ``info/...``
    infos)."""
    if name.startswith(("w/", "wd/")):
        return "weights"
    if name.startswith(("info/", "finfo/", "ep_")):
        return "info"
    if name.startswith("act/"):
        return "activations"
    if name.startswith("grad/"):
        return "gradients"
    return _KIND_BY_NAME.get(name, "control")


@dataclass
class Message:
    """An operation with JSON metadata and named arrays.

    ``codecs`` maps an array name to a codec of :mod:`frugalrl.wire.codecs` (default ``raw``),
    ``kinds`` overrides the byte-meter kind inferred from the name. ``payloads`` holds arrays already encoded
    with their codec, by a sender that had to encode them anyway (to choose between codings): the encoder and
    :func:`message_sizes` take them as they are instead of compressing again. An array that has a payload, and its
    codec, must not change afterwards (a reply built up step by step has none).
    """

    op: str
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    codecs: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    payloads: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def kind_of(self, name: str) -> str:
        """Byte-meter kind of the array ``name``."""
        return self.kinds.get(name) or default_kind(name)


def carrying(msg: Message, extra: Message) -> Message:
    """``msg``, a request of no arrays of its own, with ``extra`` inside it (its op and meta under
    ``meta["carries"]``, its arrays as the message's): one message, answered in one round trip, where the two
    would take two on a link with latency. The receiver takes it out with :func:`uncarried` and handles it first."""
    if "carries" in msg.meta or msg.arrays:
        raise ValueError(f"a {msg.op!r} message cannot carry a {extra.op!r} one (it carries one, or has arrays)")
    return Message(msg.op, {**msg.meta, "carries": {"op": extra.op, "meta": extra.meta}}, dict(extra.arrays),
                   dict(extra.codecs), dict(extra.kinds), dict(extra.payloads))


def uncarried(msg: Message) -> tuple[Message, Message | None]:
    """``msg`` without what :func:`carrying` put inside it (its op and meta: a carrying request has no arrays of its
    own), and that message, which keeps ``msg``'s arrays (shared, not copied); ``(msg, None)`` when it carries
    nothing; ``WireError`` for a ``carries`` entry that does not describe a message."""
    inside = msg.meta.get("carries")
    if inside is None:
        return msg, None
    if not isinstance(inside, dict) or not isinstance(inside.get("op"), str) or not isinstance(inside.get("meta"), dict):
        raise WireError(f"a {msg.op!r} message carries something that is not a message: {inside!r}")
    outer = Message(msg.op, {k: v for k, v in msg.meta.items() if k != "carries"})
    return outer, Message(inside["op"], inside["meta"], msg.arrays, msg.codecs, msg.kinds)


def _specs(msg: Message) -> list[list[Any]]:
    """Array specs ``[name, dtype, shape, codec?, kind?]``: codec and kind only when not the defaults."""
    specs = []
    for name, arr in msg.arrays.items():
        arr = np.asarray(arr)
        spec: list[Any] = [name, arr.dtype.str, list(arr.shape)]
        codec = msg.codecs.get(name, "raw")
        kind = msg.kind_of(name)
        if codec != "raw" or kind != default_kind(name):
            spec.append(codec)
        if kind != default_kind(name):
            spec.append(kind)
        specs.append(spec)
    return specs


def _spec_fields(spec: list[Any]) -> tuple[str, str, tuple[int, ...], str, str]:
    """``(name, dtype, shape, codec, kind)`` of a header spec."""
    name, dtype, shape = spec[0], spec[1], tuple(int(s) for s in spec[2])
    codec = spec[3] if len(spec) > 3 else "raw"
    kind = spec[4] if len(spec) > 4 else default_kind(name)
    return name, dtype, shape, codec, kind


def _header_bytes(msg: Message, specs: list[list[Any]]) -> bytes:
    return json.dumps({"op": msg.op, "meta": msg.meta, "arrays": specs}, separators=(",", ":")).encode()


def _sizes(header: bytes, specs: list[list[Any]], nbytes: list[int]) -> dict[str, int]:
    """Bytes by kind: the header as control, each payload (of ``nbytes``, in order) as its array's kind."""
    sizes: dict[str, int] = {"control": _PREFIX.size + len(header)}
    for spec, n in zip(specs, nbytes, strict=True):
        kind = _spec_fields(spec)[4]
        sizes[kind] = sizes.get(kind, 0) + n
    return sizes


def encode_message(msg: Message) -> tuple[bytes, dict[str, int]]:
    """Encode ``msg``; return the bytes and their split by kind (the header counts as control)."""
    specs = _specs(msg)
    header = _header_bytes(msg, specs)
    payloads = [payload(msg, name) for name in msg.arrays]
    blob = b"".join([_PREFIX.pack(MAGIC, len(header)), header, *payloads])
    return blob, _sizes(header, specs, [len(p) for p in payloads])


def payload(msg: Message, name: str) -> bytes:
    """The encoded payload of array ``name``: the one ``msg`` holds already, or its encoding now."""
    done = msg.payloads.get(name)
    return done if done is not None else codecs.encode(np.asarray(msg.arrays[name]), msg.codecs.get(name, "raw"))


def message_sizes(msg: Message) -> dict[str, int]:
    """Bytes by kind that ``msg`` takes on the wire: computed from shapes, without encoding, for fixed-size
    codecs; arrays with a compressing codec (``lz4``, ``zstd``) are encoded to measure them."""
    return header_and_sizes(msg)[1]


def header_and_sizes(msg: Message) -> tuple[bytes, dict[str, int]]:
    """``msg``'s JSON header and :func:`message_sizes`, from one pass over its arrays."""
    specs = _specs(msg)
    nbytes = []
    for name, arr in msg.arrays.items():
        arr = np.asarray(arr)
        codec = msg.codecs.get(name, "raw")
        if codec in codecs.VARIABLE_CODECS:
            nbytes.append(len(payload(msg, name)))
        else:
            nbytes.append(codecs.encoded_nbytes(arr.shape, arr.dtype, codec))
    header = _header_bytes(msg, specs)
    return header, _sizes(header, specs, nbytes)


_DTYPES: dict[str, np.dtype] = {}


def _wire_dtype(name: str) -> np.dtype:
    """The NumPy dtype a header names; only plain numeric and boolean dtypes may travel."""
    dt = _DTYPES.get(name) if isinstance(name, str) else None
    if dt is None:
        dt = np.dtype(name)
        if dt.kind not in "biufc" or not isinstance(name, str):
            raise TypeError(f"dtype {name!r} cannot travel on the wire")
        _DTYPES[name] = dt
    return dt


def decode_message(buf: bytes | bytearray | memoryview) -> tuple[Message, dict[str, int]]:
    """Decode bytes made by :func:`encode_message`; return the message and its sizes by kind."""
    view = memoryview(buf)
    if len(view) < _PREFIX.size:
        raise WireError(f"message too short ({len(view)} bytes)")
    magic, hlen = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireError(f"not a frugalrl message (magic {bytes(magic)!r})")
    start = _PREFIX.size
    try:
        header = json.loads(bytes(view[start : start + hlen]))
        op, meta, specs = header["op"], header["meta"], header["arrays"]
    except (ValueError, KeyError, TypeError) as e:
        raise WireError(f"corrupt message header: {e}") from e
    sizes: dict[str, int] = {"control": start + hlen}
    arrays: dict[str, np.ndarray] = {}
    msg_codecs: dict[str, str] = {}
    kinds: dict[str, str] = {}
    offset = start + hlen
    if not isinstance(op, str) or not isinstance(meta, dict) or not isinstance(specs, list):
        raise WireError("corrupt message header: wrong field types")
    for spec in specs:
        # A header that parses but does not describe its payload is as corrupt as one that does not parse.
        try:
            if not isinstance(spec, list) or not 3 <= len(spec) <= 5:
                raise ValueError("expected [name, dtype, shape, codec?, kind?]")
            name, dtype, shape, codec, kind = _spec_fields(spec)
            _wire_dtype(dtype)
            if not isinstance(name, str) or not isinstance(kind, str) or min(shape, default=0) < 0:
                raise ValueError("bad name, kind or shape")
            if codec not in codecs.ALL_CODECS:
                raise ValueError(f"unknown codec {codec!r}")
        except (ValueError, TypeError, IndexError, AttributeError) as e:
            raise WireError(f"corrupt array spec {spec!r}: {e}") from e
        try:
            nbytes = codecs.payload_nbytes(view[offset:], shape, _wire_dtype(dtype), codec)
        except (ValueError, TypeError) as e:
            raise WireError(f"corrupt array {name!r}: {e}") from e
        if offset + nbytes > len(view):
            raise WireError(f"message truncated in array {name!r}")
        try:
            arrays[name] = codecs.decode(view[offset : offset + nbytes], shape, dtype, codec)
        except (ValueError, TypeError) as e:
            raise WireError(f"corrupt array {name!r}: {e}") from e
        msg_codecs[name] = codec
        kinds[name] = kind
        sizes[kind] = sizes.get(kind, 0) + nbytes
        offset += nbytes
    return Message(op, meta, arrays, msg_codecs, kinds), sizes


def encode_state_dict(state: dict[str, Any], codec: str = "fp32", exact: tuple[str, ...] = ()) -> Message:
    """A ``weights`` message holding a PyTorch state dict; floating tensors use ``codec``, except the keys in
    ``exact`` (running statistics), which travel as they are."""
    arrays: dict[str, np.ndarray] = {}
    msg_codecs: dict[str, str] = {}
    for key, tensor in state.items():
        arr = tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
        name = f"w/{key}"
        arrays[name] = arr
        msg_codecs[name] = codec if np.issubdtype(arr.dtype, np.floating) and key not in exact else "raw"
    return Message("weights", {}, arrays, msg_codecs)


def state_arrays(msg: Message) -> dict[str, np.ndarray]:
    """The state dict carried by a message from :func:`encode_state_dict`, as arrays."""
    return {name[2:]: arr for name, arr in msg.arrays.items() if name.startswith("w/")}


def decode_state_dict(msg: Message) -> dict[str, Any]:
    """The state dict (of torch tensors) carried by a message from :func:`encode_state_dict`."""
    import torch

    return {name: torch.from_numpy(arr) for name, arr in state_arrays(msg).items()}
