"""Header books (frugalrl.wire.headers): both ends of a link number the same headers, a numbered message decodes to
the message, and a ClusterEnv's step() pays a few bytes of header per message."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frugalrl import ClusterEnv
from frugalrl.wire import headers
from frugalrl.wire.headers import HeaderBook
from frugalrl.wire.message import Message, WireError, decode_message, encode_message

pytestmark = pytest.mark.timeout(120)


def _cross(msg: Message, send: HeaderBook, receive: HeaderBook) -> tuple[bytes, dict[str, int], Message]:
    """``msg`` over a link of two books: the bytes that cross, their sizes by kind, what the receiver decodes."""
    blob, sizes = encode_message(msg)
    sent, sent_sizes = headers.pack(blob, sizes, send)
    data, crossing = headers.unpack(sent, receive)
    got, got_sizes = decode_message(data)
    assert headers.received(receive, crossing, got_sizes) == sent_sizes  # both ends count the same bytes
    return sent, sent_sizes, got


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["step", "rollout", "weights"]), st.integers(0, 3), st.integers(0, 2)),
                max_size=120))
def test_both_ends_number_the_same_headers_and_every_message_arrives_whole(sequence):
    """Any sequence of messages (some headers repeating, some not): what the receiver decodes is what was sent, the
    sizes are those of the bytes that crossed, a header is numbered from its third crossing on, and one that differs
    only in its numbers from headers that crossed twice goes by its template."""
    send, receive = HeaderBook(), HeaderBook()
    crossings: dict[bytes, int] = {}
    templates: dict[bytes, int] = {}
    for op, version, n in sequence:
        msg = Message(op, {"version": version}, {"actions": np.arange(n, dtype=np.int64)})
        blob, _ = encode_message(msg)
        header = blob[8:]
        header = header[: len(header) - 8 * n]
        sent, sizes, got = _cross(msg, send, receive)
        assert got.op == op and got.meta == {"version": version} and got.arrays["actions"].tolist() == list(range(n))
        assert sum(sizes.values()) == len(sent)
        crossings[header] = crossings.get(header, 0) + 1
        template = headers.template_of(header)[0]
        templates[template] = templates.get(template, 0) + 1
        assert (sent[:4] == headers.NUMBERED) == (crossings[header] > 2)
        assert (sent[:4] == headers.TEMPLATED) == (crossings[header] <= 2 and templates[template] > 2)
    assert send.headers == receive.headers and send.templates.items == receive.templates.items


def test_a_numbered_message_costs_six_bytes_of_header():
    send, receive = HeaderBook(), HeaderBook()
    msg = Message("step", {}, {"actions": np.zeros(2, np.int8)})
    full = [_cross(msg, send, receive)[1]["control"] for _ in range(3)]
    assert full[0] == full[1] > 60 and full[2] == headers.NUMBERED_BYTES == 6


def test_headers_that_never_repeat_are_never_numbered_and_the_book_stays_bounded():
    send, receive = HeaderBook(), HeaderBook()
    for version in range(1000):
        sent, sizes, _ = _cross(Message("weights", {"version": version}), send, receive)
        assert sent[:4] != headers.NUMBERED
        assert (sent[:4] == headers.TEMPLATED) == (version >= 2)  # the same header but for its version number
        if version >= 2:
            assert sizes["control"] == 8 + (1 if version < 128 else 2)
    assert not send.headers and len(send.exact.seen) == HeaderBook.MAX_SEEN and len(send.templates.items) == 1


def test_a_book_without_templates_numbers_whole_headers_only():
    """``HeaderBook(templates=False)`` (what the books did before templates; step_bytes.py's baseline): a header that
    differs in its numbers crosses in full every time, a repeated one still by its number."""
    send, receive = HeaderBook(templates=False), HeaderBook(templates=False)
    for version in range(5):
        assert _cross(Message("weights", {"version": version}), send, receive)[0][:4] != headers.TEMPLATED
    assert not send.templates.items
    assert [_cross(Message("step"), send, receive)[0][:4] == headers.NUMBERED for _ in range(3)] == [False, False, True]


def test_a_rollout_reply_crosses_by_its_template_and_counts_its_control_arrays():
    """A rollout reply's header differs from the last in its version and in how many episodes ended; the arrays of
    kind control (``final_idx``) still count in full when the header goes short."""
    send, receive = HeaderBook(), HeaderBook()
    rng = np.random.default_rng(0)
    for version in range(6):
        k = int(rng.integers(0, 4))
        msg = Message("rollout", {"version": version, "worker": 1},
                      {"obs": np.zeros((128, 8, 8), np.float32), "final_idx": np.zeros((k, 2), np.int32),
                       "final_obs": np.zeros((k, 8), np.float32), "ep_r": np.zeros(k)})
        blob, full = encode_message(msg)
        sent, sizes, got = _cross(msg, send, receive)
        assert got.meta == msg.meta and got.arrays["final_idx"].shape == (k, 2)
        header = len(blob) - sum(a.nbytes for a in msg.arrays.values())  # prefix and header
        assert full["control"] == header + 8 * k
        if version >= 2:  # template known: a few bytes of numbers instead of the ~250-byte header
            assert sent[:4] == headers.TEMPLATED and sizes["control"] < 8 + 20 + 8 * k
        assert sizes["control"] - 8 * k == len(sent) - sum(a.nbytes for a in msg.arrays.values())


@given(st.binary(max_size=300).filter(lambda b: b"\x00" not in b) | st.from_regex(rb"[0-9a-z.,\[\]-]{0,80}", fullmatch=True))
def test_a_template_and_its_numbers_give_the_header_back(header):
    template, values = headers.template_of(header)
    assert headers.fill(template, values) == header
    assert headers.read_varints(headers.varints(values)) == values


def test_bad_template_numbers_are_refused():
    with pytest.raises(WireError, match="template with 2 numbers came with 1"):
        headers.fill(b"a\x00b\x00", [1])
    with pytest.raises(WireError, match="end inside a number"):
        headers.read_varints(b"\x81")


def test_a_number_the_receiver_does_not_know_is_refused():
    send = HeaderBook()
    msg = Message("step", {}, {"actions": np.zeros(2, np.int8)})
    for _ in range(3):
        sent, _ = headers.pack(*encode_message(msg), send)
    with pytest.raises(WireError, match="header number 0 is unknown"):
        headers.unpack(sent, HeaderBook())
    with pytest.raises(WireError, match="without a header book"):
        headers.unpack(sent, None)


def test_a_full_header_the_receiver_had_numbered_means_the_books_differ():
    receive = HeaderBook()
    blob, sizes = encode_message(Message("step"))
    for _ in range(2):
        headers.received(receive, headers.unpack(blob, receive)[1], sizes)
    with pytest.raises(WireError, match="header books differ"):
        headers.received(receive, headers.unpack(blob, receive)[1], sizes)


@pytest.mark.parametrize("backend, inline", [("local", 0), ("serial", None)])
def test_step_pays_a_numbered_header_per_message_on_every_backend(backend, inline):
    """ClusterEnv.step() on CartPole: each worker's request and reply header, once known, is 6 bytes (it was 64 and
    163); process workers (through shared memory) and in-process ones count the same."""
    env = ClusterEnv("CartPole-v1", num_workers=2, envs_per_worker=2, backend=backend, inline_workers=inline, seed=3)
    try:
        env.reset(seed=3)
        actions = np.random.default_rng(0).integers(0, 2, size=(300, 4))
        for a in actions[:20]:
            env.step(a)
        before = env.meter.by_kind()["control"]
        for a in actions[20:]:
            env.step(a)
        per_step = (env.meter.by_kind()["control"] - before) / 280
    finally:
        env.close()
    # two workers, a request and a reply each: 24 bytes, more only when an episode's end changes a reply's layout
    assert 24 <= per_step < 40
