"""Header books: a message header that crossed a link twice crosses as a 2-byte number, and one that differs from
such a header in its numbers only crosses as its template's number and those numbers.

A hot request/reply loop (ClusterEnv's ``step()``) sends the same JSON header step after step: on CartPole a
step request's header is 64 bytes for two one-byte actions. A :class:`HeaderBook` is one direction of one link,
kept alike by its sender and its receiver: both see every header that crosses, in the same order, so both give a
header its number at its second crossing; from then on the sender sends ``b"FRL2" | u16 number | payloads`` (6
bytes in place of ``8 + header``), and shared-memory notes ``b"SHR2" | u16 number``.

Some headers differ every time in a number: a rollout's reply names its weight version and how many episodes
ended (the shapes of their arrays). Each header's *template* (the header with every run of digits cut out) is
numbered the same way, so such a header crosses as ``b"FRL3" | u16 template | u16 n | n bytes: the numbers as
varints`` (``b"SHR3"`` for notes): a few bytes of numbers in place of the whole header. The books stay bounded;
a book starts empty with its link (a restarted worker gets fresh books on both ends), and a number the receiver
does not know raises :class:`~frugalrl.wire.message.WireError`.
"""

from __future__ import annotations

import re
import struct
from collections import OrderedDict
from dataclasses import dataclass

from frugalrl.wire.message import _PREFIX, MAGIC, WireError

#: The first bytes of a message sent by its header's number.
NUMBERED = b"FRL2"
_NUMBERED = struct.Struct("<4sH")
#: The first bytes of a message sent by its header's template number and the numbers that fill it.
TEMPLATED = b"FRL3"
_TEMPLATED = struct.Struct("<4sHH")
#: The first bytes of a shared-memory note sent by its header's number (:mod:`frugalrl.wire.shared`).
NUMBERED_NOTE = b"SHR2"
#: The first bytes of a shared-memory note sent by its header's template number and numbers.
TEMPLATED_NOTE = b"SHR3"
#: Control bytes of a numbered message: what it costs on the wire in place of its header.
NUMBERED_BYTES = _NUMBERED.size

_DIGITS = re.compile(rb"([0-9]+)")
_HOLE = b"\x00"  # never in a header: JSON escapes control characters
_MAX_DIGITS = 18  # longer runs stay in the template (a varint of one stays under 10 bytes)


def template_of(header: bytes) -> tuple[bytes, list[int]]:
    """``header`` with each run of digits that reads back as itself (no leading zero, at most 18 digits) cut out,
    and the values of those runs in order: :func:`fill` gives ``header`` back, byte for byte."""
    parts = _DIGITS.split(header)  # text, digits, text, ..., text
    values: list[int] = []
    for i in range(1, len(parts), 2):
        run = parts[i]
        if len(run) <= _MAX_DIGITS and (len(run) == 1 or run[0] != 0x30):
            values.append(int(run))
            parts[i] = _HOLE
    return b"".join(parts), values


def fill(template: bytes, values: list[int]) -> bytes:
    """The header of ``template`` with ``values`` in its holes (WireError if their counts differ)."""
    parts = template.split(_HOLE)
    if len(parts) != len(values) + 1:
        raise WireError(f"a header template with {len(parts) - 1} numbers came with {len(values)}")
    out = [parts[0]]
    for value, part in zip(values, parts[1:], strict=True):
        out += [b"%d" % value, part]
    return b"".join(out)


def varints(values: list[int]) -> bytes:
    """``values`` (non-negative) as LEB128 varints: 7 bits a byte, the high bit set on all but each value's last."""
    out = bytearray()
    for value in values:
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def read_varints(data: bytes | memoryview) -> list[int]:
    """The values :func:`varints` wrote (WireError if ``data`` ends inside one or one is too long)."""
    values, value, shift = [], 0, 0
    for byte in bytes(data):
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 7 * 9:
                raise WireError("a header number longer than 10 bytes")
            continue
        values.append(value)
        value, shift = 0, 0
    if shift:
        raise WireError("the header numbers end inside a number")
    return values


class _Numbering:
    """Byte strings numbered at their second sighting (both ends of a link see the same ones, in the same order)."""

    def __init__(self, max_numbers: int, max_seen: int, max_len: int) -> None:
        self.max_numbers, self.max_seen, self.max_len = max_numbers, max_seen, max_len
        self.numbers: dict[bytes, int] = {}
        self.items: list[bytes] = []
        self.seen: OrderedDict[bytes, None] = OrderedDict()  # seen once, most recent last

    def see(self, item: bytes) -> int | None:
        """The number of ``item``, or None if it has none yet (this sighting counted)."""
        number = self.numbers.get(item)
        if number is not None:
            return number
        if item in self.seen:
            del self.seen[item]
            if len(self.items) < self.max_numbers:
                self.numbers[item] = len(self.items)
                self.items.append(item)
        elif len(item) <= self.max_len:
            self.seen[item] = None
            if len(self.seen) > self.max_seen:
                self.seen.popitem(last=False)
        return None

    def get(self, number: int, what: str) -> bytes:
        if not 0 <= number < len(self.items):
            raise WireError(f"{what} number {number} is unknown on this link ({len(self.items)} numbered)")
        return self.items[number]


@dataclass(frozen=True)
class Crossing:
    """How a received header crossed: in full (``short`` None), or as the ``short`` bytes of its number or, where
    ``templated``, of its template's number and its numbers."""

    header: bytes
    short: int | None = None
    templated: bool = False


class HeaderBook:
    """The numbered headers and header templates of one direction of one link."""

    MAX_NUMBERS = 4096
    MAX_SEEN = 64
    MAX_HEADER = 4096  # longer headers (a policy spec) are rare: never numbered

    def __init__(self, templates: bool = True) -> None:
        self.use_templates = templates  # False: number whole headers only (as the books did before templates)
        self.exact = _Numbering(self.MAX_NUMBERS, self.MAX_SEEN, self.MAX_HEADER)
        self.templates = _Numbering(self.MAX_NUMBERS, self.MAX_SEEN, self.MAX_HEADER)
        self._notes: dict[bytes, bytes] = {}  # sender: a shared-frame note -> its numbered form, once numbered
        self._numbered_notes: dict[bytes, tuple[bytes, Crossing]] = {}  # receiver: a numbered note -> note, crossing

    @property
    def headers(self) -> list[bytes]:
        """The numbered headers, in number order."""
        return self.exact.items

    def short_form(self, header: bytes, note: bool = False) -> bytes | None:
        """What stands for ``header`` this time (the number's bytes or the template's, with the magic of a message
        or, with ``note``, of a shared-memory note), or None if it crosses in full; this crossing counted."""
        number = self.exact.see(header)
        if number is not None:
            return _NUMBERED.pack(NUMBERED_NOTE if note else NUMBERED, number)
        template = self._see_template(header)
        if template is None:
            return None
        number, values = template
        data = varints(values)  # under 0xFFFF bytes: a header of at most 4 KiB holds fewer numbers than that
        return _TEMPLATED.pack(TEMPLATED_NOTE if note else TEMPLATED, number, len(data)) + data

    def _see_template(self, header: bytes) -> tuple[int, list[int]] | None:
        if not self.use_templates or len(header) > self.MAX_HEADER or _HOLE in header:  # no hole in JSON headers
            return None
        template, values = template_of(header)
        number = self.templates.see(template)
        return None if number is None else (number, values)

    def expand(self, short: bytes | memoryview) -> Crossing:
        """The header a short form (:meth:`short_form`, magic first) stands for, as a :class:`Crossing`."""
        view = memoryview(short)
        magic = bytes(view[:4])
        if magic in (NUMBERED, NUMBERED_NOTE) and len(view) >= NUMBERED_BYTES:
            return Crossing(self.exact.get(_NUMBERED.unpack_from(view, 0)[1], "header"), NUMBERED_BYTES)
        if magic in (TEMPLATED, TEMPLATED_NOTE) and len(view) >= _TEMPLATED.size:
            _, number, n = _TEMPLATED.unpack_from(view, 0)
            end = _TEMPLATED.size + n
            if len(view) < end:
                raise WireError("a templated header truncated in its numbers")
            header = fill(self.templates.get(number, "header template"), read_varints(view[_TEMPLATED.size : end]))
            return Crossing(header, end, templated=True)
        raise WireError(f"not a short header form (magic {magic!r})")

    def received(self, crossing: Crossing) -> None:
        """Count a received header as the sender counted it; WireError where the two books cannot agree."""
        if crossing.short is None:  # in full: the sender had neither its number nor its template's
            if self.exact.see(crossing.header) is not None or self._see_template(crossing.header) is not None:
                raise WireError("a header came in full that this link had numbered: the two ends' header books differ")
        elif crossing.templated and self.exact.see(crossing.header) is not None:
            raise WireError("a header came by its template that this link had numbered: the two ends' books differ")


def as_sent(sizes: dict[str, int], header_len: int, short: bytes | int | None) -> dict[str, int]:
    """A message's ``sizes`` by kind (its prefix and full header of ``header_len`` bytes in ``control``, with the
    arrays of that kind) with ``short`` (bytes, or their count) in place of prefix and header."""
    if short is None:
        return sizes
    n = short if isinstance(short, int) else len(short)
    return {**sizes, "control": sizes["control"] - _PREFIX.size - header_len + n}


def send_sizes(book: HeaderBook | None, header: bytes, sizes: dict[str, int]) -> tuple[bytes | None, dict[str, int]]:
    """What stands for ``header`` in ``book`` this time (None: it goes in full) and the message's sizes as sent."""
    short = None if book is None else book.short_form(header)
    return short, as_sent(sizes, len(header), short)


def pack(blob: bytes, sizes: dict[str, int], book: HeaderBook | None) -> tuple[bytes, dict[str, int]]:
    """An encoded message (of ``sizes`` by kind) as ``book`` sends it (its header short once known), and its sizes as
    sent."""
    end = _PREFIX.size + _PREFIX.unpack_from(blob, 0)[1]
    short, sent = send_sizes(book, bytes(blob[_PREFIX.size : end]), sizes)
    return (blob, sent) if short is None else (short + blob[end:], sent)


def unpack(data: bytes | bytearray | memoryview,
           book: HeaderBook | None) -> tuple[bytes | bytearray | memoryview, Crossing | None]:
    """The encoded message that ``data`` (as :func:`pack` made it) stands for, with ``book`` the sender's; and how its
    header crossed, which the receiver then counts (:func:`received`); None: not a frugalrl message."""
    view = memoryview(data)
    magic = bytes(view[:4])
    if magic in (NUMBERED, TEMPLATED):
        if book is None:
            raise WireError("a numbered message arrived on a link without a header book")
        crossing = book.expand(view)
        assert crossing.short is not None
        return b"".join([_PREFIX.pack(MAGIC, len(crossing.header)), crossing.header, view[crossing.short :]]), crossing
    if magic == MAGIC and len(view) >= _PREFIX.size:
        hlen = _PREFIX.unpack_from(view, 0)[1]
        return data, Crossing(bytes(view[_PREFIX.size : _PREFIX.size + hlen]))
    return data, None


def pack_note(note: bytes, magic: bytes, book: HeaderBook | None, sizes: dict[str, int]) -> tuple[bytes, dict[str, int]]:
    """A shared-memory note (``magic`` + header) as ``book`` sends it, and the message's sizes as sent."""
    if book is None:
        return note, sizes
    short = book._notes.get(note)  # the hot path: a note of a known shape is the same object every time
    if short is None:
        short = book.short_form(note[len(magic) :], note=True)
        if short is None:
            return note, sizes
        if short[:4] == NUMBERED_NOTE:
            book._notes[note] = short
    return short, as_sent(sizes, len(note) - len(magic), short)


def unpack_note(note: bytes | memoryview, magic: bytes, book: HeaderBook | None) -> tuple[bytes, Crossing]:
    """The note (``magic`` + header) that ``note`` stands for, and how its header crossed."""
    note = bytes(note)
    if note[:4] not in (NUMBERED_NOTE, TEMPLATED_NOTE):
        return note, Crossing(note[len(magic) :])
    if book is None:
        raise WireError("a numbered note arrived on a link without a header book")
    known = book._numbered_notes.get(note)
    if known is not None:
        return known
    crossing = book.expand(note)
    if crossing.short != len(note):
        raise WireError("a short note with bytes after its header")
    full = magic + crossing.header
    if not crossing.templated:
        book._numbered_notes[note] = (full, crossing)
    return full, crossing


def received(book: HeaderBook | None, crossing: Crossing | None, sizes: dict[str, int]) -> dict[str, int]:
    """Count a received message's header as it crossed (:func:`unpack`, :func:`unpack_note`), and return its ``sizes``
    by kind as it crossed. A header that came in full although the receiver had numbered it (or its template) means
    the two books are out of step."""
    if book is None or crossing is None:
        return sizes
    book.received(crossing)
    return as_sent(sizes, len(crossing.header), crossing.short)
