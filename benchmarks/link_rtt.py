"""What one request and its reply cost on an emulated link with delay, by request size: raw TCP (for each
congestion control asked for) and a Ray actor call, against the link's round trip.

Two :class:`frugalrl.netem.TestHosts` joined by a link with ``--delay`` one way (netem, or a TUN link's forwarder,
:mod:`frugalrl.tunlink`); host 1 answers, host 0 asks. For each request size (the reply is 100 bytes) it times
``--calls`` exchanges back to back (median), and ``--idle-calls`` exchanges each after an idle spell longer than
TCP's retransmission timeout (median), when Linux restarts a connection from its initial window unless
``net.ipv4.tcp_slow_start_after_idle`` is 0. Separates what the link and the kernel's TCP add to a round trip from
what Ray adds. Needs root and iproute2 (and ray for ``--ray``). Example::

    python benchmarks/link_rtt.py --delay 20ms --sizes 1000 5000 10000 16000 30000 60000 --ray
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _commit import measured_commit

from frugalrl import netem
from frugalrl.wire.channel import recv_exact

RESULTS = Path(__file__).parent / "results"
PORT = 5599
REPLY = 100
IDLE_S = 0.5  # at least; longer than the RTO of a 40 ms round trip (~240 ms): the window restarts after it


def _tcp_socket(sock: socket.socket, cc: str) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as gRPC sets it
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    return sock


def serve(address: str, cc: str) -> None:
    """Answer ``(request size, reply size)`` headers with the reply's bytes, one connection, until it closes."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, PORT))
    listener.listen(1)
    print("listening", flush=True)
    conn = _tcp_socket(listener.accept()[0], cc)
    while True:
        try:
            size, reply = struct.unpack("!II", recv_exact(conn, 8))
        except EOFError:
            return
        recv_exact(conn, size)
        conn.sendall(bytes(reply))


def _timings(call: Any, size: int, calls: int, idle_calls: int, idle_s: float) -> dict[str, float]:
    """Median milliseconds of ``call(size)`` back to back and after an idle spell of ``idle_s`` each."""
    for _ in range(3):
        call(size)
    back = []
    for _ in range(calls):
        start = time.perf_counter()
        call(size)
        back.append(time.perf_counter() - start)
    idle = []
    for _ in range(idle_calls):
        time.sleep(idle_s)
        start = time.perf_counter()
        call(size)
        idle.append(time.perf_counter() - start)
    return {"back_to_back_ms": statistics.median(back) * 1e3, "after_idle_ms": statistics.median(idle) * 1e3}


def idle_seconds(one_way: float) -> float:
    """An idle spell longer than TCP's retransmission timeout on a link of ``one_way`` delay (~3 round trips)."""
    return max(IDLE_S, 6 * one_way + 0.2)


def ask_tcp(address: str, cc: str, sizes: list[int], calls: int, idle_calls: int, idle_s: float) -> None:
    """Time requests of each size to :func:`serve`; prints one JSON row per size."""
    sock = _tcp_socket(socket.create_connection((address, PORT)), cc)

    def call(size: int) -> None:
        sock.sendall(struct.pack("!II", size, REPLY) + bytes(size))
        recv_exact(sock, REPLY)

    for size in sizes:
        print(json.dumps({"transport": f"tcp-{cc}", "size": size, **_timings(call, size, calls, idle_calls, idle_s)}),
              flush=True)


def ask_ray(address: str, sizes: list[int], calls: int, idle_calls: int, idle_s: float) -> None:
    """Time Ray actor calls whose argument is ``size`` bytes (sent inline: under Ray's 100 KiB) on the other host."""
    import numpy as np
    import ray

    ray.init(address=address, log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Echo:
        def answer(self, request: Any) -> bytes:
            return bytes(REPLY)

    actor = Echo.remote()  # type: ignore[attr-defined]
    ray.get(actor.answer.remote(b""))
    payloads = {size: np.zeros(size, np.uint8) for size in sizes}
    for size in sizes:
        row = _timings(lambda n: ray.get(actor.answer.remote(payloads[n])), size, calls, idle_calls,
                       idle_s)
        print(json.dumps({"transport": "ray", "size": size, **row}), flush=True)


def _rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", default="20ms", help="one-way delay on each host's egress")
    ap.add_argument("--rate", default=None, help="a tbf rate on each host's egress too (default: none)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000, 16000, 30000, 60000])
    ap.add_argument("--ccs", default="bbr,cubic", help="TCP congestion controls to time raw TCP with")
    ap.add_argument("--ray", action="store_true", help="also time Ray actor calls (the kernel's default control)")
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--idle-calls", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "link_rtt.json"))
    ap.add_argument("--serve", nargs=2, metavar=("ADDRESS", "CC"), help=argparse.SUPPRESS)
    ap.add_argument("--ask-tcp", nargs=2, metavar=("ADDRESS", "CC"), help=argparse.SUPPRESS)
    ap.add_argument("--ask-ray", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.calls < 1 or args.idle_calls < 1:
        ap.error("--calls and --idle-calls must be at least 1")
    one_way = netem.parse_delay(args.delay)
    idle_s = idle_seconds(one_way)
    if args.serve:
        serve(*args.serve)
        return {}
    if args.ask_tcp:
        ask_tcp(*args.ask_tcp, args.sizes, args.calls, args.idle_calls, idle_s)
        return {}
    if args.ask_ray:
        ask_ray(args.ask_ray, args.sizes, args.calls, args.idle_calls, idle_s)
        return {}

    sizes = [str(s) for s in args.sizes]
    counts = ["--calls", str(args.calls), "--idle-calls", str(args.idle_calls), "--delay", args.delay]
    me = [sys.executable, str(Path(__file__).resolve())]
    rows: list[dict[str, Any]] = []
    with netem.TestHosts(n=2, link=netem.default_link(one_way > 0)) as hosts:
        link = hosts.link
        hosts.shape(rate=args.rate, delay=args.delay)
        kernel = {key: hosts.run(0, ["sysctl", "-n", key], capture_output=True, text=True).stdout.strip()
                  for key in ("net.ipv4.tcp_congestion_control", "net.ipv4.tcp_slow_start_after_idle")}
        for cc in args.ccs.split(","):
            server = hosts.popen(1, [*me, "--serve", hosts.address(1), cc], stdout=subprocess.PIPE, text=True)
            try:
                assert server.stdout is not None
                server.stdout.readline()  # "listening"
                asked = hosts.run(0, [*me, "--ask-tcp", hosts.address(1), cc, "--sizes", *sizes, *counts],
                                  capture_output=True, text=True, timeout=600)
                if asked.returncode != 0:
                    raise RuntimeError(f"the TCP calls with {cc} failed:\n{asked.stderr[-2000:]}")
                rows += _rows(asked.stdout)
            finally:
                server.kill()
                server.wait()
            print(f"tcp-{cc}: done", flush=True)
        if args.ray:
            from frugalrl.ray_hosts import RayCluster

            with RayCluster(hosts, worker_cpus=1) as cluster:
                asked = hosts.run(0, [*me, "--ask-ray", cluster.address, "--sizes", *sizes, *counts],
                                  capture_output=True, text=True, timeout=600, env=cluster.env)
                if asked.returncode != 0:
                    raise RuntimeError(f"the Ray calls failed:\n{asked.stderr[-2000:]}")
                rows += _rows(asked.stdout)
    for row in rows:
        for key in ("back_to_back_ms", "after_idle_ms"):
            row[key] = round(row[key], 2)
            row[key.replace("_ms", "_extra_rtt")] = round((row[key] / 1e3 - 2 * one_way) / (2 * one_way), 3) \
                if one_way > 0 else None
    result = {
        "command": "link_rtt.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": measured_commit(),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "delay": args.delay, "rate": args.rate, "rtt_s": 2 * one_way, "link": link,
        "kernel": kernel, "reply_bytes": REPLY, "idle_s": idle_s, "rows": rows,
    }
    for row in rows:
        print(f"{row['transport']:>10} {row['size']:>7} B: {row['back_to_back_ms']:7.1f} ms back to back, "
              f"{row['after_idle_ms']:7.1f} ms after {idle_s:g} s idle")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
