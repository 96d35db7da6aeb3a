"""Header books: after a message header has crossed a link twice, it crosses as a 2-byte number.

A hot request/reply loop (ClusterEnv's ``step()``) sends the same JSON header step after step: on CartPole a
step request's header is 64 bytes for two one-byte actions. A :class:`HeaderBook` is one direction of one link,
kept alike by its sender and its receiver: both run :meth:`HeaderBook.see` on every header sent in full, in the
same order, so both give a header its number at its second full crossing; from then on the sender sends
``b"FRL2" | u16 number | payloads`` (6 bytes in place of ``8 + header``), and shared-memory notes ``b"SHR2" |
u16 number``. Headers that differ every time (a weight version in the meta) are never numbered; the books stay
bounded. A book starts empty with its link (a restarted worker gets fresh books on both ends), and a number the
receiver does not know raises :class:`~frugalrl.wire.message.WireError`.
"""

from __future__ import annotations

import struct
from collections import OrderedDict

from frugalrl.wire.message import _PREFIX, MAGIC, WireError

#: The first bytes of a message sent by its header's number.
NUMBERED = b"FRL2"
_NUMBERED = struct.Struct("<4sH")
#: The first bytes of a shared-memory note sent by its header's number (:mod:`frugalrl.wire.shared`).
NUMBERED_NOTE = b"SHR2"
#: Control bytes of a numbered message: what it costs on the wire in place of its header.
NUMBERED_BYTES = _NUMBERED.size


class HeaderBook:
    """The numbered headers of one direction of one link, and the headers seen once (most recent last)."""

    MAX_NUMBERS = 4096
    MAX_SEEN = 64
    MAX_HEADER = 4096  # longer headers (a policy spec) are rare: never numbered

    def __init__(self) -> None:
        self.numbers: dict[bytes, int] = {}
        self.headers: list[bytes] = []
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._notes: dict[bytes, bytes] = {}  # a shared-frame note <-> its numbered form, both ways, once numbered

    def see(self, header: bytes) -> int | None:
        """The number of ``header``, or None if it crosses in full this time (and is counted as such)."""
        number = self.numbers.get(header)
        if number is not None:
            return number
        if header in self._seen:
            del self._seen[header]
            if len(self.headers) < self.MAX_NUMBERS:
                self.numbers[header] = len(self.headers)
                self.headers.append(header)
        elif len(header) <= self.MAX_HEADER:
            self._seen[header] = None
            if len(self._seen) > self.MAX_SEEN:
                self._seen.popitem(last=False)
        return None

    def header(self, number: int) -> bytes:
        """The header of ``number`` (WireError if this book has not numbered it)."""
        if not 0 <= number < len(self.headers):
            raise WireError(f"header number {number} is unknown on this link ({len(self.headers)} numbered)")
        return self.headers[number]


def send_sizes(book: HeaderBook | None, header: bytes, sizes: dict[str, int]) -> tuple[int | None, dict[str, int]]:
    """``header``'s number in ``book`` (None: it goes in full) and the message's sizes by kind as sent."""
    number = None if book is None else book.see(header)
    if number is None:
        return None, sizes
    return number, {**sizes, "control": NUMBERED_BYTES}


def pack(blob: bytes, sizes: dict[str, int], book: HeaderBook | None) -> tuple[bytes, dict[str, int]]:
    """An encoded message (of ``sizes`` by kind) as ``book`` sends it (numbered once its header is known), and its sizes as sent."""
    hlen = _PREFIX.unpack_from(blob, 0)[1]
    end = _PREFIX.size + hlen
    number, sent = send_sizes(book, bytes(blob[_PREFIX.size : end]), sizes)
    if number is None:
        return blob, sent
    return _NUMBERED.pack(NUMBERED, number) + blob[end:], sent


def unpack(data: bytes | bytearray | memoryview,
           book: HeaderBook | None) -> tuple[bytes | bytearray | memoryview, bytes | None]:
    """The encoded message that ``data`` (as :func:`pack` made it) stands for, with ``book`` the sender's; and its
    header if it came in full, which the receiver then counts (:func:`received`)."""
    view = memoryview(data)
    magic = bytes(view[:4])
    if magic == NUMBERED:
        if book is None or len(view) < NUMBERED_BYTES:
            raise WireError("a numbered message arrived on a link without a header book")
        header = book.header(_NUMBERED.unpack_from(view, 0)[1])
        return b"".join([_PREFIX.pack(MAGIC, len(header)), header, view[NUMBERED_BYTES:]]), None
    if magic == MAGIC and len(view) >= _PREFIX.size:
        hlen = _PREFIX.unpack_from(view, 0)[1]
        return data, bytes(view[_PREFIX.size : _PREFIX.size + hlen])
    return data, None


def pack_note(note: bytes, magic: bytes, book: HeaderBook | None, sizes: dict[str, int]) -> tuple[bytes, dict[str, int]]:
    """A shared-memory note (``magic`` + header) as ``book`` sends it, and the message's sizes as sent."""
    if book is not None:
        numbered = book._notes.get(note)  # the hot path: a note of a known shape is the same object every time
        if numbered is not None:
            return numbered, {**sizes, "control": NUMBERED_BYTES}
    number, sent = send_sizes(book, note[len(magic) :], sizes)
    if number is None or book is None:
        return note, sent
    numbered = book._notes[note] = _NUMBERED.pack(NUMBERED_NOTE, number)
    return numbered, sent


def unpack_note(note: bytes | memoryview, magic: bytes, book: HeaderBook | None) -> tuple[bytes, bytes | None]:
    """The note (``magic`` + header) that ``note`` stands for, and its header if it came in full."""
    note = bytes(note)
    if note[:4] != NUMBERED_NOTE:
        return note, note[len(magic) :]
    if book is None or len(note) != NUMBERED_BYTES:
        raise WireError("a numbered note arrived on a link without a header book")
    full = book._notes.get(note)
    if full is None:
        full = book._notes[note] = magic + book.header(_NUMBERED.unpack(note)[1])
    return full, None


def received(book: HeaderBook | None, header: bytes | None, sizes: dict[str, int]) -> dict[str, int]:
    """Count a received message's header if it came in full (``header``; None: it came as its number), and return
    its ``sizes`` by kind as it crossed. A full header the receiver had numbered means the two books are out of
    step."""
    if book is None:
        return sizes
    if header is None:
        return {**sizes, "control": NUMBERED_BYTES}
    if book.see(header) is not None:
        raise WireError("a header came in full that this link had numbered: the two ends' header books differ")
    return sizes
