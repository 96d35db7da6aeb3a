"""Weights as code words, and delta-coded weights: what a worker is sent when it already holds an older copy.

A weights message carries, per state-dict key, the tensor's *code words*: for a floating tensor the very bytes
:func:`frugalrl.wire.codecs.encode` makes of it with the weights codec, read as unsigned words (``uint32`` for
``fp32``, ``uint16`` for ``bf16`` / ``fp16``, ``uint8`` for ``int8``: its scale then its codes); any other tensor
(integers, and the ``exact`` ones such as running statistics) as it is. :func:`to_words` makes them,
:func:`from_words` turns them into arrays with :func:`frugalrl.wire.codecs.decode`, the decoder a message of that
codec goes through, so every transport (one that encodes, or one that hands the message over as it is) gives a
worker the same values.

A receiver keeps the words it holds (:class:`HeldWeights`). Against them, :func:`weights_update` codes the next
version's words as a delta, per word size: the XOR of the new words with the held ones, or their difference
(below), compressed with the lossless ``zstd`` codec (byte planes, then zstd), or, where few words changed, their
indices (Golomb-Rice gaps, :mod:`frugalrl.wire.rice`) and XOR values; nothing for a word size that did not change.
It sends whichever is smallest, the full copy included.

The difference is in float order, zigzag-coded (:func:`difference`): a few ulps give a small number, where an XOR
spreads over every bit a carry crosses. The delta is on the code words, so it is exact for every codec, lossy
ones too: the receiver rebuilds the words the full message would carry, bit for bit, and decodes them alike.

A delta names its base version and the CRC-32 of the words it leads to; :meth:`HeldWeights.resolve` refuses one
whose base is not what the receiver holds, or whose result does not match (:class:`DeltaError`): the sender then
sends a full copy. Nothing here imports torch.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frugalrl.wire import codecs, rice
from frugalrl.wire.floats import difference, undo_difference
from frugalrl.wire.message import Message, message_sizes

#: Bytes of each code word of a weights codec.
WORD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
#: A state dict's arrays by key: code words for the coded tensors, the others as they are.
Words = dict[str, np.ndarray]

_XOR, _DIFF, _INDEX, _VALUES = "wd/x", "wd/d", "wd/i", "wd/v"
_SPEC_NBYTES = 24  # about what one more array adds to a message header
_K = struct.Struct("<B")


class DeltaError(ValueError):
    """A delta that does not apply to the words held (another base, or a result that fails its checksum)."""


def to_words(state: Mapping[str, np.ndarray], codec: str, exact: Collection[str] = ()) -> Words:
    """The arrays a weights message carries (fresh copies): the floating ones but ``exact`` as ``codec``'s code
    words (flat), the others as they are."""
    words: Words = {}
    for key, value in state.items():
        arr = np.asarray(value)
        if np.issubdtype(arr.dtype, np.floating) and key not in exact:
            words[key] = np.frombuffer(codecs.encode(arr, codec), dtype=f"u{WORD_BYTES[codec]}").copy()
        else:
            words[key] = np.array(arr, copy=True, order="C")
    return words


def from_words(words: Words, like: Mapping[str, tuple[tuple[int, ...], np.dtype]], codec: str) -> dict[str, np.ndarray]:
    """The arrays ``words`` code, for a receiver whose own state dict has the keys, shapes and dtypes ``like``:
    unsigned words for a floating tensor are ``codec``'s, decoded by :func:`frugalrl.wire.codecs.decode` to its
    shape and dtype; any other array is the tensor as it travelled (a buffer may change size)."""
    if set(words) != set(like):
        raise ValueError(f"weights for keys {sorted(set(words) ^ set(like))} do not match the policy's")
    out: dict[str, np.ndarray] = {}
    for key, arr in words.items():
        shape, dtype = like[key]
        if np.issubdtype(np.dtype(dtype), np.floating) and arr.dtype.kind == "u":
            out[key] = codecs.decode(np.ascontiguousarray(arr).tobytes(), shape, np.dtype(dtype).str, codec)
        else:
            out[key] = np.array(arr, copy=True)
    return out


def checksum(words: Words) -> int:
    """CRC-32 of the words' bytes, in order."""
    crc = 0
    for arr in words.values():
        crc = zlib.crc32(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data, crc)
    return crc


def full_message(words: Words, meta: dict[str, Any]) -> Message:
    """The full copy: every key's words (``w/<key>``, kind ``weights``), with ``meta``."""
    return Message("weights", dict(meta), {f"w/{key}": arr for key, arr in words.items()})


def weights_update(new: Words, base: Words | None, meta: dict[str, Any], base_version: int | None) -> Message:
    """The smaller of the full copy of ``new`` and its delta against ``base`` (which the receiver holds as
    ``base_version``); the full copy where there is no base or the keys, shapes or dtypes differ."""
    full = full_message(new, meta)
    if base is None or base_version is None or not _same_layout(new, base):
        return full
    delta = Message("weights", {**meta, "base": int(base_version), "crc": checksum(new)})
    old_groups = _groups(base)
    for size, words in _groups(new).items():
        xor = np.bitwise_xor(old_groups[size], words)
        changed = np.flatnonzero(xor)
        if changed.size:
            _code_changes(delta, size, old_groups[size], words, xor, changed)
    return delta if sum(message_sizes(delta).values()) < sum(message_sizes(full).values()) else full


def _code_changes(delta: Message, size: int, old: np.ndarray, new: np.ndarray, xor: np.ndarray,
                  changed: np.ndarray) -> None:
    """Add to ``delta`` the cheapest coding of one word size's changes: the whole XOR, the whole difference, or the
    changed words' indices and XOR (whose indices are only coded where their values alone are smaller than the
    rest). The compressed payload measured to choose is the one the message sends (``Message.payloads``)."""
    dense_name, dense_words, dense = _XOR, xor, codecs.encode(xor, "zstd")
    diff = difference(old, new)
    by_diff = codecs.encode(diff, "zstd")
    if len(by_diff) < len(dense):
        dense_name, dense_words, dense = _DIFF, diff, by_diff
    values = xor[changed]
    sparse = codecs.encode(values, "zstd")
    if len(sparse) + _SPEC_NBYTES < len(dense):
        gaps = rice.gaps(changed)
        k, sum_q = rice.plan(gaps)
        index = np.frombuffer(_K.pack(k) + rice.encode(gaps, k, sum_q), dtype=np.uint8)
        if index.size + len(sparse) + _SPEC_NBYTES < len(dense):
            _add(delta, f"{_INDEX}{size}", index)
            _add(delta, f"{_VALUES}{size}", values, sparse)
            return
    _add(delta, f"{dense_name}{size}", dense_words, dense)


def _add(msg: Message, name: str, arr: np.ndarray, zstd: bytes | None = None) -> None:
    """Put ``arr`` in ``msg``: raw, or as the ``zstd`` payload already made of it."""
    msg.arrays[name] = arr
    if zstd is not None:
        msg.codecs[name], msg.payloads[name] = "zstd", zstd


def apply_delta(base: Words, arrays: Mapping[str, np.ndarray]) -> Words:
    """The words a delta's ``arrays`` lead to from ``base`` (``DeltaError`` if they do not fit it)."""
    groups = _groups(base)
    names = {n for n in arrays if n.startswith("wd/")}
    for size, old in groups.items():
        xor, diff, index, values = (arrays.get(f"{p}{size}") for p in (_XOR, _DIFF, _INDEX, _VALUES))
        names -= {f"{p}{size}" for p in (_XOR, _DIFF, _INDEX, _VALUES)}
        if xor is not None:
            if xor.shape != old.shape or xor.dtype != old.dtype:
                raise DeltaError(f"XOR of {xor.dtype} {xor.shape} for {old.size} words of {size} bytes")
            groups[size] = np.bitwise_xor(old, xor)
        elif diff is not None:
            if diff.shape != old.shape or diff.dtype != old.dtype:
                raise DeltaError(f"difference of {diff.dtype} {diff.shape} for {old.size} words of {size} bytes")
            groups[size] = undo_difference(old, diff)
        elif index is not None and values is not None:
            if index.dtype != np.uint8 or index.size < 1 or values.dtype != old.dtype or values.ndim != 1:
                raise DeltaError(f"corrupt changed words of {size} bytes")
            try:
                idx = rice.decode(memoryview(index[1:].tobytes()), old.size, values.size, int(index[0]))
            except ValueError as e:
                raise DeltaError(f"corrupt changed-word indices: {e}") from e
            new = old.copy()
            new[idx] ^= values
            groups[size] = new
    if names:
        raise DeltaError(f"delta arrays {sorted(names)} match no words held")
    return _split(groups, base)


@dataclass
class HeldWeights:
    """A receiver's copy: the version and the words of the last weights message it applied."""

    version: int | None = None
    words: Words | None = field(default=None, repr=False)

    def resolve(self, msg: Message) -> Words:
        """The words ``msg`` (a full copy or a delta) gives; ``DeltaError`` if it is a delta against words this
        copy does not hold. Nothing changes until :meth:`keep`."""
        if "base" not in msg.meta:
            return {name[2:]: arr for name, arr in msg.arrays.items() if name.startswith("w/")}
        base = msg.meta["base"]
        if self.words is None or self.version != base:
            raise DeltaError(f"a delta against version {base}, but this copy holds version {self.version}")
        words = apply_delta(self.words, msg.arrays)
        if checksum(words) != msg.meta.get("crc"):
            raise DeltaError(f"the delta against version {base} does not give the words it names (checksum)")
        return words

    def keep(self, version: int, words: Words) -> None:
        """Hold ``words`` as ``version`` (once they are applied)."""
        self.version, self.words = int(version), words

    def clear(self) -> None:
        """Hold nothing (a new policy, a restored snapshot): the next message must be a full copy."""
        self.version = self.words = None


# ---------------------------------------------------------------------------------------------- layout
def _unsigned(arr: np.ndarray) -> np.ndarray:
    """``arr``'s bytes as flat unsigned words of its item size (bytes for odd sizes)."""
    arr = np.ascontiguousarray(arr).reshape(-1)
    size = arr.dtype.itemsize
    return arr.view(f"u{size}" if size in (1, 2, 4, 8) else "u1")


def _same_layout(a: Words, b: Words) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape for k in a)


def _groups(words: Words) -> dict[int, np.ndarray]:
    """Every key's words, by word size, concatenated in key order."""
    parts: dict[int, list[np.ndarray]] = {}
    for arr in words.values():
        u = _unsigned(arr)
        parts.setdefault(u.dtype.itemsize, []).append(u)
    return {size: np.concatenate(p) for size, p in parts.items()}


def _split(groups: dict[int, np.ndarray], like: Words) -> Words:
    """:func:`_groups` undone, with the keys, dtypes and shapes of ``like``."""
    offsets = dict.fromkeys(groups, 0)
    out: Words = {}
    for key, arr in like.items():
        size, n = _unsigned(arr).dtype.itemsize, _unsigned(arr).size
        start = offsets[size]
        out[key] = groups[size][start : start + n].view(arr.dtype).reshape(arr.shape)
        offsets[size] = start + n
    return out
