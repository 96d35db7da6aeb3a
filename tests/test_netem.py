"""frugalrl.netem: hosts in network namespaces reach each other, shaping takes effect, cleanup is total.

Skipped unless netns_available() (root, ip, tc, namespaces). The delay test also needs the kernel's
netem qdisc; loss works without it (BPF fallback). Measured numbers are printed (pytest -s to see).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frugalrl import netem
from frugalrl.netem import TestHosts

OK, WHY = netem.netns_available()
pytestmark = [
    pytest.mark.skipif(not OK, reason=f"network namespaces unavailable: {WHY}"),
    pytest.mark.timeout(60),
]
PREFIX = "frltest"
PORT = 47011
PY = sys.executable

# Host 0 runs a server that prints "ready" once listening; host 1 runs a client that prints a number.
TCP_SINK = """
import socket, sys
n = int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], {port})); s.listen(1); s.settimeout(20)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(20)
got = 0
while got < n:
    b = c.recv(1 << 16)
    if not b:
        break
    got += len(b)
c.sendall(b"ok"); c.close()
"""
TCP_SOURCE = """
import socket, sys, time
n = int(sys.argv[2])
c = socket.create_connection((sys.argv[1], {port}), timeout=20)
t0 = time.perf_counter()
c.sendall(b"x" * n)
assert c.recv(2) == b"ok"
print(time.perf_counter() - t0)
"""
TCP_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], {port})); s.listen(1); s.settimeout(20)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(20)
while b := c.recv(64):
    c.sendall(b)
"""
TCP_PING = """
import socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], {port}), timeout=20)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter(); c.sendall(b"p"); assert c.recv(1) == b"p"
    rtts.append(time.perf_counter() - t0)
print(statistics.median(rtts))
"""
UDP_COUNT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], {port})); s.settimeout(20)
print("ready", flush=True)
got = 0
while True:
    b = s.recv(2048)
    if b == b"end":
        break
    got += 1
print(got, flush=True)
"""
UDP_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(b"d" * 100, (sys.argv[1], {port}))
    if i % 20 == 19:
        time.sleep(0.0005)
time.sleep(0.2)
for _ in range(50):  # the end marker may be dropped too: send it many times
    s.sendto(b"end", (sys.argv[1], {port})); time.sleep(0.002)
"""


def _script(src: str) -> str:
    return src.format(port=PORT)


def _serve(hosts: TestHosts, server: str, arg: int) -> subprocess.Popen[str]:
    """Start ``server`` in host 0 and wait until it says it listens."""
    p = hosts.popen(
        0, [PY, "-c", _script(server), hosts.address(0), str(arg)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line == "ready", f"server did not start (exit {p.poll()})"
    return p


def _client(hosts: TestHosts, client: str, arg: int) -> float:
    """Run ``client`` in host 1 against host 0 and return the number it prints."""
    r = hosts.run(1, [PY, "-c", _script(client), hosts.address(0), str(arg)],
                  capture_output=True, text=True, timeout=25)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return float(r.stdout.strip())


def _transfer_mbit_s(hosts: TestHosts, nbytes: int) -> tuple[float, float]:
    srv = _serve(hosts, TCP_SINK, nbytes)
    secs = _client(hosts, TCP_SOURCE, nbytes)
    srv.wait(timeout=10)
    return secs, nbytes * 8 / secs / 1e6


def _ours() -> list[str]:
    return [ns for ns in netem.list_namespaces() if ns.startswith(f"{PREFIX}-{os.getpid()}-")]


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    assert _ours() == [], "namespaces left behind"


def test_two_hosts_reach_each_other_and_rate_shaping():
    nbytes = 2_000_000
    with TestHosts(2, prefix=PREFIX) as hosts:
        assert hosts.address(0) == "10.213.0.1" and hosts.address(1) == "10.213.0.2"
        assert set(hosts.namespaces) <= set(netem.list_namespaces())
        secs, fast = _transfer_mbit_s(hosts, nbytes)
        print(f"\nunshaped: {nbytes} B in {secs:.4f} s = {fast:.0f} Mbit/s")
        assert fast > 50

        hosts.shape(rate="10mbit")
        secs, slow = _transfer_mbit_s(hosts, nbytes)
        print(f"rate 10mbit: {nbytes} B in {secs:.3f} s = {slow:.2f} Mbit/s")
        assert secs >= 1.3
        assert 5 <= slow <= 12

        hosts.shape()  # unshaped again, live
        secs, again = _transfer_mbit_s(hosts, nbytes)
        print(f"unshaped again: {again:.0f} Mbit/s")
        assert again > 50


def test_bridge_of_three_hosts():
    with TestHosts(3, prefix=PREFIX) as hosts:
        assert hosts.switch is not None
        for src, dst in [(1, 0), (2, 0), (2, 1)]:
            code = (
                "import socket, sys, time\n"
                "t = time.monotonic() + 5\n"
                "while True:\n"
                "    try:\n"
                "        socket.create_connection((sys.argv[1], 9), timeout=2); break\n"
                "    except ConnectionRefusedError:\n"
                "        print('refused'); break\n"  # a RST came back: the host is reachable
                "    except OSError:\n"
                "        if time.monotonic() > t: raise\n"
                "        time.sleep(0.05)\n"
            )
            r = hosts.run(
                src, [PY, "-c", code, hosts.address(dst)], capture_output=True, text=True, timeout=10
            )
            assert r.returncode == 0 and "refused" in r.stdout, r.stderr


TUN = os.path.exists("/dev/net/tun")


@pytest.mark.parametrize("link", ["veth", "tun"])
def test_delay_adds_round_trip(link):
    """One-way delay on every host's egress: netem's on a veth link, the forwarding process's on a TUN link
    (:mod:`frugalrl.tunlink`, where the kernel has no netem); set live, and taken off live."""
    if link == "veth" and not netem.netem_available()[0]:
        pytest.skip(f"delay on a veth link needs the netem qdisc: {netem.netem_available()[1]}")
    if link == "tun" and not TUN:
        pytest.skip("no /dev/net/tun")
    delay = 0.05
    with TestHosts(2, prefix=PREFIX, link=link) as hosts:
        rtts = []
        for shaping in ({}, {"delay": f"{delay * 1000:.0f}ms"}, {}):  # set live, and taken off live
            hosts.shape(**shaping)
            echo = _serve(hosts, TCP_ECHO, 0)
            rtts.append(_client(hosts, TCP_PING, 5))
            echo.wait(timeout=10)  # gone before the next one listens on its port
        base, shaped, again = rtts
    print(f"\n{link}: median RTT unshaped {base * 1e3:.3f} ms, delay {delay * 1e3:.0f} ms each way: "
          f"{shaped * 1e3:.1f} ms, unshaped again {again * 1e3:.3f} ms")
    assert base < 0.02 and again < 0.02
    assert 2 * delay * 0.95 <= shaped <= 2 * delay + 0.02


def test_delay_unavailable_on_veth_is_reported_and_cleaned_up():
    if netem.netem_available()[0]:
        pytest.skip("this kernel has netem")
    with pytest.raises(netem.ShapingUnavailable, match="link='tun'"):
        TestHosts(2, prefix=PREFIX, delay="10ms", link="veth").setup()


@pytest.mark.parametrize(("has_netem", "delayed", "link"),
                         [(True, True, "veth"), (True, False, "veth"), (False, True, "tun"), (False, False, "veth")])
def test_the_default_link_is_tun_only_for_a_delay_the_kernel_cannot_add(monkeypatch, has_netem, delayed, link):
    monkeypatch.setattr(netem, "netem_available", lambda: (has_netem, "" if has_netem else "no sch_netem"))
    assert netem.default_link(delayed) == link
    hosts = TestHosts(3, prefix=PREFIX, delay="1ms" if delayed else None)  # not entered: nothing is built
    assert hosts.link == link and (hosts.switch is None) == (link == "tun")


@pytest.mark.skipif(not TUN, reason="no /dev/net/tun")
def test_tun_link_where_netem_is_missing_joins_hosts_shapes_rates_and_leaves_nothing():
    """A delay without netem gets a TUN link by itself; its forwarder joins three hosts (no bridge), tc's rate
    limit works on its devices, and it exits with the hosts."""
    nbytes = 1_000_000
    with TestHosts(3, prefix=PREFIX, delay=None if netem.netem_available()[0] else "1ms") as auto:
        assert auto.link == ("veth" if netem.netem_available()[0] else "tun")
    with TestHosts(3, prefix=PREFIX, link="tun") as hosts:
        assert hosts.switch is None and hosts.dev == "tun0"
        forwarder = hosts._forwarder
        assert forwarder is not None
        secs, fast = _transfer_mbit_s(hosts, nbytes)
        hosts.shape(rate="10mbit", delay="5ms")
        secs, slow = _transfer_mbit_s(hosts, nbytes)
        print(f"\ntun: unshaped {fast:.0f} Mbit/s, rate 10mbit + 5 ms: {slow:.2f} Mbit/s")
        assert fast > 50 and 5 <= slow <= 12
        r = hosts.run(2, [PY, "-c", "import socket,sys; socket.create_connection((sys.argv[1], 9), timeout=5)",
                          hosts.address(1)], capture_output=True, text=True, timeout=10)
        assert "ConnectionRefusedError" in r.stderr  # host 1 answered host 2 (a RST): the forwarder routes by address
    assert forwarder.poll() is not None  # stopped with the hosts: no orphan


TCP_SINK_OF_TWO = """
import socket, sys, threading, time
n = int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], {port})); s.listen(2); s.settimeout(20)
print("ready", flush=True)
ends = []
def take(c):
    got = 0
    while got < n and (b := c.recv(1 << 16)):
        got += len(b)
    ends.append(time.perf_counter()); c.sendall(b"ok"); c.close()
conns = [s.accept()[0] for _ in range(2)]
t0 = time.perf_counter()
threads = [threading.Thread(target=take, args=(c,)) for c in conns]
for t in threads: t.start()
for t in threads: t.join()
print(2 * n * 8 / (max(ends) - t0) / 1e6, flush=True)
"""


def _into_host0_from_two_mbit_s(hosts: TestHosts, nbytes: int) -> float:
    """Mbit/s that hosts 1 and 2 send to host 0 at once (``nbytes`` each), as host 0 receives it."""
    sink = _serve(hosts, TCP_SINK_OF_TWO, nbytes)
    sources = [hosts.popen(i, [PY, "-c", _script(TCP_SOURCE), hosts.address(0), str(nbytes)],
                           stdout=subprocess.PIPE, text=True) for i in (1, 2)]
    for p in sources:
        assert p.wait(timeout=40) == 0
    out, _ = sink.communicate(timeout=10)
    return float(out.strip())


@pytest.mark.parametrize("link", ["veth", "tun"])
def test_ingress_limits_what_one_host_receives_from_many(link):
    """With ``ingress``, two hosts sending to a third at once share its link's rate (the switch port toward it, a
    bridge's or the TUN forwarder's); without it each sends at the rate and the third receives their sum."""
    if link == "tun" and not TUN:
        pytest.skip("no /dev/net/tun")
    nbytes = 1_500_000
    with TestHosts(3, prefix=PREFIX, link=link) as hosts:
        hosts.shape(rate="10mbit")
        summed = _into_host0_from_two_mbit_s(hosts, nbytes)
        hosts.shape(rate="10mbit", ingress=True)
        shared = _into_host0_from_two_mbit_s(hosts, nbytes)
        hosts.shape()
        free = _into_host0_from_two_mbit_s(hosts, nbytes)
    print(f"\n{link}: two senders at 10 Mbit/s each into one host: {summed:.1f} Mbit/s; with ingress {shared:.1f}; "
          f"unshaped {free:.0f}")
    assert 15 <= summed <= 22 and 7 <= shared <= 11 and free > 50


def test_loss():
    n = 2000
    with TestHosts(2, prefix=PREFIX) as hosts:
        results = {}
        for pct in (0, 30):
            hosts.shape(loss=pct)
            srv = _serve(hosts, UDP_COUNT, n)
            r = hosts.run(1, [PY, "-c", _script(UDP_SEND), hosts.address(0), str(n)], timeout=15)
            assert r.returncode == 0
            out, _ = srv.communicate(timeout=10)
            results[pct] = int(out.strip()) / n
        how = "netem" if netem.netem_available()[0] else "BPF fallback"
        print(f"\ndelivered: loss 0% -> {results[0]:.3f}, loss 30% ({how}) -> {results[30]:.3f}")
        assert results[0] >= 0.99
        assert 0.6 <= results[30] <= 0.8


def test_cleanup_on_exception_failed_setup_and_stale():
    with pytest.raises(RuntimeError, match="boom"), TestHosts(3, prefix=PREFIX) as hosts:
        names = [*hosts.namespaces, hosts.switch]
        assert set(names) <= set(netem.list_namespaces())
        raise RuntimeError("boom")
    assert not set(names) & set(netem.list_namespaces())

    with pytest.raises(ValueError):
        TestHosts(2, prefix=PREFIX, rate="fast").setup()  # fails after the namespaces exist
    assert _ours() == []

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{PREFIX}-{dead.pid}-0-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True, timeout=10)
    try:
        with TestHosts(2, prefix=PREFIX) as live:
            deleted = netem.cleanup_stale(PREFIX)
            assert stale in deleted
            assert not set(live.namespaces) & set(deleted)  # our own live set survives
            assert set(live.namespaces) <= set(netem.list_namespaces())
    finally:
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True, timeout=10)
    assert stale not in netem.list_namespaces()


def test_a_delay_that_is_not_a_duration_is_refused():
    """NaN would leave a TUN forwarder spinning on a packet never due; negative or absurd delays are typos."""
    for bad in (float("nan"), -0.01, "5h", 1e9):
        with pytest.raises(ValueError, match="delay"):
            netem.parse_delay(bad)
    assert netem.parse_delay("20ms") == pytest.approx(0.02)


def test_command_line_shapes_the_bridge_ports_with_ingress():
    """``python -m frugalrl.netem up/shape --ingress`` puts the rate on the bridge's port toward each host too."""
    def port_qdisc() -> str:
        return subprocess.run(["ip", "netns", "exec", f"{PREFIX}-cli-sw", "tc", "qdisc", "show", "dev", "p1"],
                              capture_output=True, text=True, check=True).stdout
    try:
        assert netem.main(["--prefix", PREFIX, "up", "-n", "3", "--rate", "10mbit", "--ingress"]) == 0
        assert "tbf" in port_qdisc() and "10Mbit" in port_qdisc()
        assert netem.main(["--prefix", PREFIX, "shape", "--rate", "5mbit"]) == 0
        assert "tbf" not in port_qdisc()
        assert netem.main(["--prefix", PREFIX, "shape", "--rate", "5mbit", "--ingress"]) == 0
        assert "5Mbit" in port_qdisc()
        assert netem.main(["--prefix", PREFIX, "shape", "--ingress"]) == 1  # a rate is needed
    finally:
        netem.main(["--prefix", PREFIX, "down"])
    assert not [ns for ns in netem.list_namespaces() if ns.startswith(f"{PREFIX}-cli-")]


@pytest.mark.skipif(not (TUN or netem.netem_available()[0]), reason="no delay here: neither netem nor /dev/net/tun")
def test_link_rtt_benchmark_times_a_round_trip_by_request_size(tmp_path):
    """benchmarks/link_rtt.py on a 5 ms link: raw TCP's request/reply takes at least the round trip, larger
    requests no less, and the file says which link and kernel settings it ran on."""
    out = tmp_path / "rtt.json"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "link_rtt.py"
    r = subprocess.run([PY, str(script), "--delay", "5ms", "--sizes", "1000", "30000", "--ccs", "cubic",
                        "--calls", "3", "--idle-calls", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    small, large = result["rows"]
    assert (small["transport"], small["size"], large["size"]) == ("tcp-cubic", 1000, 30000)
    assert 10.0 <= small["back_to_back_ms"] <= large["back_to_back_ms"] + 1.0
    assert small["after_idle_ms"] >= 10.0 and result["kernel"]["net.ipv4.tcp_slow_start_after_idle"] in {"0", "1"}
    assert result["rtt_s"] == pytest.approx(0.01) and "net.ipv4.tcp_congestion_control" in result["kernel"]
