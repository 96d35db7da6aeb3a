"""The TUN forwarder's switch ports (frugalrl.tunlink.Forwarder), on socket pairs standing in for the hosts' TUN
devices and with explicit clocks: the order packets leave a rate-limited port, its burst, its queue bound."""

from __future__ import annotations

import socket

import pytest

from frugalrl.netem import QUEUE_S, SUBNET
from frugalrl.tunlink import Forwarder


def _packet(dest: int, size: int = 1000) -> bytes:
    """An IPv4 packet of ``size`` bytes to host ``dest`` (only what the forwarder reads is filled in)."""
    header = bytearray(20)
    header[0] = 0x45
    header[16:20] = bytes([*(int(x) for x in SUBNET.split(".")), dest + 1])
    return bytes(header) + bytes(size - 20)


@pytest.fixture
def hosts():
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(3)]
    for ours, _ in pairs:
        ours.setblocking(False)
    yield pairs
    for a, b in pairs:
        a.close()
        b.close()


def _forwarder(hosts, delays, rate=0.0, burst_bytes=0.0):
    fw = Forwarder([ours.fileno() for ours, _ in hosts], SUBNET, delays)
    fw.set_port(2, rate, burst_bytes)
    return fw


def _arrivals(fw, host, times):
    """Deliver at each of ``times``; the number of packets host ``host`` holds after each."""
    got, counts = 0, []
    theirs = host[1]
    theirs.setblocking(False)
    for t in times:
        fw.deliver(t)
        while True:
            try:
                theirs.recv(65536)
            except BlockingIOError:
                break
            got += 1
        counts.append(got)
    return counts


def test_a_port_takes_packets_in_the_order_they_reach_it(hosts):
    """A packet from a far host (250 ms) does not hold up one from a near host sent just after it."""
    fw = _forwarder(hosts, [0.25, 0.0, 0.0], rate=1e6, burst_bytes=1500)
    hosts[0][1].send(_packet(2))
    fw.take(hosts[0][0].fileno(), now=0.0)
    hosts[1][1].send(_packet(2))
    fw.take(hosts[1][0].fileno(), now=0.001)
    assert _arrivals(fw, hosts[2], [0.002, 0.24, 0.251]) == [1, 1, 2]


def test_an_idle_port_lets_a_burst_through_and_queues_the_rest_at_its_rate(hosts):
    """Four 1000-byte packets at once through a 1 Mbit/s port with a 2,000-byte bucket: two leave at once, the
    others 8 ms apart."""
    fw = _forwarder(hosts, [0.0, 0.0, 0.0], rate=1e6, burst_bytes=2000)
    for _ in range(4):
        hosts[1][1].send(_packet(2))
    fw.take(hosts[1][0].fileno(), now=0.0)
    assert _arrivals(fw, hosts[2], [0.0, 0.0079, 0.0081, 0.0159, 0.0161]) == [2, 2, 3, 3, 4]


def test_a_packet_that_would_queue_too_long_is_dropped(hosts):
    fw = _forwarder(hosts, [0.0, 0.0, 0.0], rate=1e5)  # 80 ms per 1000-byte packet, no burst
    n = int(QUEUE_S / 0.08) + 3  # the ones past 200 ms of waiting are dropped
    for _ in range(n):
        hosts[1][1].send(_packet(2))
    fw.take(hosts[1][0].fileno(), now=0.0)
    assert _arrivals(fw, hosts[2], [10.0])[-1] == int(QUEUE_S / 0.08)  # each waits its own 80 ms too
