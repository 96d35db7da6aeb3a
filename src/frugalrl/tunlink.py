"""A link with delay for test hosts on kernels without ``sch_netem``: each host's interface is a TUN device, and one
forwarding process delivers every IPv4 packet to the host it is addressed to after the sender's one-way delay.

The kernels of many VMs and containers lack ``netem``, the one qdisc that delays packets, so
:class:`~frugalrl.netem.TestHosts` could shape rates (``tbf``) and loss there but not latency. With
``TestHosts(link="tun")`` every host gets ``tun0`` instead of a veth: what a host sends leaves its kernel as a
raw IP packet on ``tun0`` (after the host's own ``tc`` shaping, so rate and loss keep working), this process reads
it, holds it for the sender's delay and writes it to the destination host's ``tun0``, where its kernel receives
it. It stands for the wire and the switch of a real network (the TCP stacks at both ends are the kernel's); it
costs a read and a write per packet in Python, some tens of thousands of packets a second (hundreds of Mbit/s
at the 1,500-byte MTU), on a core the hosts' processes share.

Run by :class:`~frugalrl.netem.TestHosts`: ``python -m frugalrl.tunlink CONFIG_JSON`` (``namespaces``, ``dev``,
``subnet``, ``delays``) creates the devices in the namespaces, prints ``ready``, then forwards until its stdin
closes; a line ``delay HOST SECONDS`` on stdin changes a host's egress delay live, ``rate HOST BITS`` the token
bucket of the switch port toward a host (0: none; the hosts' ``tbf`` burst, :meth:`Forwarder.set_port`), where the other
hosts' packets to it queue in the order they reach it, as at a real NIC's ingress (for at most
:data:`frugalrl.netem.QUEUE_S`; later packets are dropped, as a full switch buffer drops them). Needs root.
"""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import json
import os
import select
import struct
import sys
import time

from frugalrl.netem import QUEUE_S, tbf_burst

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def open_tun(namespace: str, dev: str) -> int:
    """A new TUN device ``dev`` in network namespace ``namespace`` (raw IP packets, no header), as a non-blocking
    file descriptor; the device lives as long as the descriptor."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY)
    try:
        _setns(target)
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TUN | IFF_NO_PI))
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)
    return fd


class Forwarder:
    """The packets in flight between hosts whose TUN descriptors are ``fds`` (host ``i`` has ``subnet.{i+1}``)."""

    def __init__(self, fds: list[int], subnet: str, delays: list[float]) -> None:
        self.delays = list(delays)
        self.rates = [0.0] * len(fds)  # bits/s of the switch port toward each host (0: no limit)
        self.bursts = [0.0] * len(fds)  # its token bucket's depth, in seconds of its rate
        self.port_free = [0.0] * len(fds)  # when each port has sent what it holds
        prefix = bytes(int(x) for x in subnet.split("."))
        self.route = {prefix + bytes([i + 1]): i for i in range(len(fds))}
        self.fds = fds
        self.source = {fd: i for i, fd in enumerate(fds)}
        # (due, order, destination host, packet, whether it still has to pass the port toward that host)
        self.queue: list[tuple[float, int, int, bytes, bool]] = []
        self.order = 0

    def take(self, fd: int, now: float) -> None:
        """Read every packet waiting on ``fd`` and schedule each for its destination (others are dropped)."""
        delay = self.delays[self.source[fd]]
        while True:
            try:
                packet = os.read(fd, 65536)
            except BlockingIOError:
                return
            if len(packet) < 20 or packet[0] >> 4 != 4:  # not IPv4 (IPv6 router solicitations and the like)
                continue
            dest = self.route.get(packet[16:20])
            if dest is None:
                continue
            self.order += 1
            heapq.heappush(self.queue, (now + delay, self.order, dest, packet, bool(self.rates[dest])))

    def set_port(self, host: int, rate: float, burst: float | None = None) -> None:
        """Limit the switch port toward ``host`` to ``rate`` bits/s (0: no limit), a token bucket of ``burst`` bytes
        (default: the hosts' ``tbf`` burst, :func:`frugalrl.netem.tbf_burst`)."""
        if burst is None:
            burst = tbf_burst(int(rate)) if rate else 0
        self.rates[host] = rate
        self.bursts[host] = burst * 8 / rate if rate else 0.0

    def _through_port(self, due: float, dest: int, packet: bytes) -> float | None:
        """When a packet that reaches the port toward ``dest`` at ``due`` leaves it (a token bucket: what exceeds
        the burst waits its turn at the rate), or None if it would wait longer than :data:`frugalrl.netem.QUEUE_S`."""
        rate = self.rates[dest]
        if not rate:
            return due
        finish = max(due, self.port_free[dest]) + len(packet) * 8 / rate
        leave = max(due, finish - self.bursts[dest])
        if leave - due > QUEUE_S:
            return None
        self.port_free[dest] = finish
        return leave

    def deliver(self, now: float) -> None:
        """Write every packet that is due."""
        queue = self.queue
        while queue and queue[0][0] <= now:
            due, order, dest, packet, at_port = heapq.heappop(queue)
            if at_port:  # the port takes packets in the order they reach it, whatever their senders' delays
                leave = self._through_port(due, dest, packet)
                if leave is not None:
                    heapq.heappush(queue, (leave, order, dest, packet, False))
                continue
            try:
                os.write(self.fds[dest], packet)
            except OSError:  # the receiving device is down or its queue full: the packet is lost, as on a wire
                pass

    def timeout(self, now: float) -> float | None:
        """Seconds until the next packet is due (None: nothing in flight)."""
        return max(0.0, self.queue[0][0] - now) if self.queue else None


def main(argv: list[str] | None = None) -> int:
    config = json.loads((argv if argv is not None else sys.argv[1:])[0])
    fds = [open_tun(ns, config["dev"]) for ns in config["namespaces"]]
    forwarder = Forwarder(fds, config["subnet"], config["delays"])
    control = sys.stdin.fileno()
    os.set_blocking(control, False)
    print("ready", flush=True)
    pending = b""
    watched = [control, *fds]
    while True:
        now = time.monotonic()
        ready, _, _ = select.select(watched, [], [], forwarder.timeout(now))
        now = time.monotonic()
        for fd in ready:
            if fd != control:
                forwarder.take(fd, now)
                continue
            try:
                chunk = os.read(control, 4096)
            except BlockingIOError:
                continue
            if not chunk:  # the hosts are gone
                return 0
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                words = line.decode().split()
                if len(words) == 3 and words[0] == "delay":
                    forwarder.delays[int(words[1])] = float(words[2])
                elif len(words) == 3 and words[0] == "rate":
                    forwarder.set_port(int(words[1]), float(words[2]))
        forwarder.deliver(now)


if __name__ == "__main__":
    sys.exit(main())
