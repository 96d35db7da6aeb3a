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
    data, full = headers.unpack(sent, receive)
    got, _ = decode_message(data)
    headers.received(receive, full, {})
    return sent, sent_sizes, got


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["step", "rollout", "weights"]), st.integers(0, 3), st.integers(0, 2)),
                max_size=120))
def test_both_ends_number_the_same_headers_and_every_message_arrives_whole(sequence):
    """Any sequence of messages (some headers repeating, some not): what the receiver decodes is what was sent, the
    sizes are those of the bytes that crossed, and a header is numbered from its third crossing on."""
    send, receive = HeaderBook(), HeaderBook()
    crossings: dict[bytes, int] = {}
    for op, version, n in sequence:
        msg = Message(op, {"version": version}, {"actions": np.arange(n, dtype=np.int64)})
        blob, _ = encode_message(msg)
        header = blob[8:]
        header = header[: len(header) - 8 * n]
        sent, sizes, got = _cross(msg, send, receive)
        assert got.op == op and got.meta == {"version": version} and got.arrays["actions"].tolist() == list(range(n))
        assert sum(sizes.values()) == len(sent)
        crossings[header] = crossings.get(header, 0) + 1
        assert (sent[:4] == headers.NUMBERED) == (crossings[header] > 2)
    assert send.headers == receive.headers


def test_a_numbered_message_costs_six_bytes_of_header():
    send, receive = HeaderBook(), HeaderBook()
    msg = Message("step", {}, {"actions": np.zeros(2, np.int8)})
    full = [_cross(msg, send, receive)[1]["control"] for _ in range(3)]
    assert full[0] == full[1] > 60 and full[2] == headers.NUMBERED_BYTES == 6


def test_headers_that_never_repeat_are_never_numbered_and_the_book_stays_bounded():
    send, receive = HeaderBook(), HeaderBook()
    for version in range(1000):
        sent, _, _ = _cross(Message("weights", {"version": version}), send, receive)
        assert sent[:4] != headers.NUMBERED
    assert not send.headers and len(send._seen) == HeaderBook.MAX_SEEN


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
    blob, _ = encode_message(Message("step"))
    for _ in range(2):
        headers.received(receive, headers.unpack(blob, receive)[1], {})
    with pytest.raises(WireError, match="header books differ"):
        headers.received(receive, headers.unpack(blob, receive)[1], {})


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
