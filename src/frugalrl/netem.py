"""Test hosts in network namespaces, with their links shaped by ``tc``, for multi-node benchmarks.

:class:`TestHosts` builds ``n`` hosts, each its own network namespace with one interface ``veth0`` addressed
``10.213.0.{i+1}/24``, joined by a veth pair (two hosts) or by a bridge in a namespace of its own: nothing is
created in, or routed through, the caller's namespace, and deleting the namespaces deletes everything.
:meth:`TestHosts.shape` shapes every host's egress (so both directions of a link): ``rate`` (``tbf``), one-way
``delay`` (``netem``) and ``loss`` (``netem``, or a BPF filter where the kernel lacks ``sch_netem``:
:func:`netem_available`). Where the kernel has no netem, ``link="tun"`` (chosen by itself for a delay) joins the
hosts through TUN devices and a forwarding process that adds the delay (:mod:`frugalrl.tunlink`). Namespace names carry the pid, so parallel runs never clash;
:func:`cleanup_stale` removes the sets of dead processes. Needs root, ``ip`` and ``tc``.

By hand (every command and the shaping in detail: docs/multi-node.md#test-hosts-emulated-machines-and-links)::

    python -m frugalrl.netem check                 # can namespaces (and netem) be used here?
    python -m frugalrl.netem up -n 3 --rate 10mbit --delay 20ms --loss 1   # persistent hosts frl-cli-h0..
    python -m frugalrl.netem down                  # delete the CLI hosts
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import re
import select
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, Literal

SUBNET = "10.213.0"
"""Hosts get ``{SUBNET}.{i+1}/24``; nothing outside our namespaces ever uses it."""
DEV = "veth0"
"""Name of each host's interface (inside its own namespace) on a veth link."""
TUN_DEV = "tun0"
"""Name of each host's interface on a TUN link (:mod:`frugalrl.tunlink`)."""
Link = Literal["veth", "tun"]
CLI_TAG = "cli"
"""Tag used in the names of hosts made by ``python -m frugalrl.netem up``."""

_counter = itertools.count()
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_]{1,20}$")
_CMD_TIMEOUT = 20.0

Rate = str | int | None
Delay = str | float | None
Loss = str | float | None


class ShapingUnavailable(RuntimeError):
    """The kernel lacks what a requested kind of shaping needs (e.g. ``sch_netem`` for delay)."""


# ----------------------------------------------------------------------------------------- helpers


def _cmd(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a short administrative command; raise with its stderr when ``check`` and it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)!r} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ns_cmd(ns: str, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside namespace ``ns``."""
    return _cmd(["ip", "netns", "exec", ns, *argv], check=check)


def list_namespaces() -> list[str]:
    """Names of all network namespaces known to ``ip netns``."""
    out = _cmd(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _delete_namespace(ns: str) -> None:
    _cmd(["ip", "netns", "delete", ns], check=False)


def _check_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"prefix must be 1-20 characters of [A-Za-z0-9_], got {prefix!r}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_RATE_UNITS = {
    "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
}  # fmt: skip


def parse_rate(rate: str | int) -> int:
    """Rate in bit/s from ``tc``'s notation (``"10mbit"``, ``"1gbit"``, ``"500kbps"`` = bytes/s) or an int."""
    if isinstance(rate, int):
        bits = rate
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", rate)
        if not m or m.group(2).lower() not in _RATE_UNITS | {"": 1}:
            raise ValueError(f"cannot parse rate {rate!r} (use e.g. '10mbit', '500kbit', '1gbit')")
        bits = int(float(m.group(1)) * _RATE_UNITS.get(m.group(2).lower(), 1))
    if bits <= 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    return bits


def parse_delay(delay: str | float) -> float:
    """Delay in seconds from ``"20ms"``, ``"1s"``, ``"500us"`` or a number of seconds."""
    if isinstance(delay, int | float):
        sec = float(delay)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|ms|us|)\s*", delay)
        if not m:
            raise ValueError(f"cannot parse delay {delay!r} (use e.g. '20ms', '0.5s', '200us')")
        sec = float(m.group(1)) * {"s": 1.0, "": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]
    if not 0 <= sec < 3600:  # NaN too: a forwarder would never deliver
        raise ValueError(f"delay must be a number of seconds in [0, 3600), got {delay!r}")
    return sec


def parse_loss(loss: str | float) -> float:
    """Loss in percent (0-100) from ``1.5``, ``"1.5"`` or ``"1.5%"``."""
    pct = float(loss.strip().rstrip("%")) if isinstance(loss, str) else float(loss)
    if not 0.0 <= pct <= 100.0:
        raise ValueError(f"loss is a percentage in [0, 100], got {loss!r}")
    return pct


# ------------------------------------------------------------------------------------ availability


@functools.cache
def netns_available() -> tuple[bool, str]:
    """Whether :class:`TestHosts` can work here: root, ``ip``, ``tc``, and a namespace with a veth pair.

    Returns ``(True, "")`` or ``(False, reason)``. The probe makes (and deletes) one namespace.
    """
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "network namespaces need root (euid is not 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' not found (apt-get install -y iproute2)"
    ns = f"frlprobe-{os.getpid()}-{next(_counter)}"
    try:
        proc = _cmd(["ip", "netns", "add", ns], check=False)
        if proc.returncode != 0:
            return False, f"cannot create a network namespace: {proc.stderr.strip()}"
        proc = _cmd(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], check=False)
        if proc.returncode != 0:
            return False, f"cannot create a veth pair: {proc.stderr.strip()}"
        proc = _cmd(["ip", "-n", ns, "link", "set", "lo", "up"], check=False)
        if proc.returncode != 0:
            return False, f"cannot bring loopback up in a namespace: {proc.stderr.strip()}"
        return True, ""
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"probing network namespaces failed: {e}"
    finally:
        _delete_namespace(ns)


@functools.cache
def netem_available() -> tuple[bool, str]:
    """Whether the kernel has ``sch_netem`` (needed for ``delay``; ``loss`` has a BPF fallback)."""
    ok, why = netns_available()
    if not ok:
        return False, why
    ns = f"frlprobe-{os.getpid()}-{next(_counter)}"
    try:
        _cmd(["ip", "netns", "add", ns])
        _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        proc = _ns_cmd(ns, ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
        if proc.returncode != 0:
            return False, f"the kernel has no netem qdisc (sch_netem): {proc.stderr.strip()}"
        return True, ""
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        return False, f"probing netem failed: {e}"
    finally:
        _delete_namespace(ns)


# ---------------------------------------------------------------------------------------- shaping


def _loss_bpf_bytecode(pct: float) -> str:
    """Classic BPF for ``tc ... bpf da bytecode``: drop (TC_ACT_SHOT) with probability ``pct``/100."""
    threshold = min(int(round(pct / 100.0 * 2**32)), 2**32 - 1)
    rand = 0xFFFFF000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM: A = a random u32
    prog = [
        (0x20, 0, 0, rand),  # ld [rand]
        (0x35, 0, 1, threshold),  # jge #threshold -> keep, else -> drop
        (0x06, 0, 0, 0),  # ret TC_ACT_OK
        (0x06, 0, 0, 2),  # ret TC_ACT_SHOT
    ]
    return f"{len(prog)}," + ",".join(f"{c} {jt} {jf} {k}" for c, jt, jf, k in prog)


def clear_shaping(ns: str, dev: str = DEV) -> None:
    """Remove any shaping (root qdisc and clsact filters) from ``dev`` in namespace ``ns``."""
    _ns_cmd(ns, ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
    _ns_cmd(ns, ["tc", "qdisc", "del", "dev", dev, "clsact"], check=False)


QUEUE_S = 0.2
"""The longest a packet waits at a rate limit (``tbf``'s ``latency``; a TUN link's switch port the same); later
packets are dropped, as a full buffer drops them."""


def tbf_burst(rate_bits: int) -> int:
    """The burst (bytes) of the token bucket a rate limit gets: ~4 ms of traffic, at least four full-size frames."""
    return max(rate_bits // 8 // 250, 4 * 1514)


def apply_shaping(ns: str, dev: str = DEV, rate: Rate = None, delay: Delay = None, loss: Loss = None) -> None:
    """Replace the egress shaping of ``dev`` in namespace ``ns``; all ``None`` leaves it unshaped.

    ``rate`` uses ``tbf``; ``delay`` and ``loss`` use ``netem`` (``loss`` falls back to a random-drop
    BPF filter when the kernel has no netem). Raises :class:`ShapingUnavailable` for a delay
    without netem, :class:`ValueError` for values that do not parse.
    """
    rate_bits = parse_rate(rate) if rate is not None else None
    delay_s = parse_delay(delay) if delay is not None else None
    loss_pct = parse_loss(loss) if loss is not None else None
    if delay_s == 0.0:
        delay_s = None
    if loss_pct == 0.0:
        loss_pct = None
    have_netem = netem_available()[0] if (delay_s is not None or loss_pct is not None) else False
    if delay_s is not None and not have_netem:
        raise ShapingUnavailable(f"delay needs netem: {netem_available()[1]}; TestHosts(link='tun') adds it in a "
                                 "forwarding process (frugalrl.tunlink)")

    clear_shaping(ns, dev)
    tc = ["tc", "qdisc", "add", "dev", dev]
    netem_args: list[str] = []
    if delay_s is not None:
        netem_args += ["delay", f"{delay_s * 1e6:.0f}us"]
    if loss_pct is not None and have_netem:
        netem_args += ["loss", f"{loss_pct:g}%"]
    tbf_args: list[str] = []
    if rate_bits is not None:
        burst = tbf_burst(rate_bits)
        tbf_args = ["tbf", "rate", f"{rate_bits}bit", "burst", str(burst), "latency", f"{QUEUE_S * 1e3:g}ms"]

    if netem_args:
        # netem's own queue (packets) must hold what the delay keeps in flight
        _ns_cmd(ns, [*tc, "root", "handle", "1:", "netem", *netem_args, "limit", "10000"])
        if tbf_args:
            _ns_cmd(ns, [*tc, "parent", "1:1", "handle", "10:", *tbf_args])
    elif tbf_args:
        _ns_cmd(ns, [*tc, "root", "handle", "10:", *tbf_args])
    if loss_pct is not None and not have_netem:
        _ns_cmd(ns, [*tc, "clsact"])
        code = _loss_bpf_bytecode(loss_pct)
        _ns_cmd(ns, ["tc", "filter", "add", "dev", dev, "egress", "bpf", "da", "bytecode", code])


# ------------------------------------------------------------------------------------------ hosts


def default_link(delayed: bool) -> Link:
    """The link :class:`TestHosts` takes by default: a TUN link where a delay is wanted and the kernel has no netem,
    else veth."""
    return "tun" if delayed and not netem_available()[0] else "veth"


class TestHosts:
    """``n`` hosts in fresh network namespaces on one shaped link; a context manager.

    >>> with TestHosts(2, rate="10mbit") as hosts:                       # doctest: +SKIP
    ...     srv = hosts.popen(0, ["python", "-m", "http.server", "--bind", hosts.address(0)])
    ...     hosts.run(1, ["curl", f"http://{hosts.address(0)}:8000/"], timeout=10)

    Host ``i`` (0-based) is namespace ``self.namespaces[i]`` with address :meth:`address` ``(i)`` =
    ``10.213.0.{i+1}`` on interface :attr:`dev`: ``veth0``, or with ``link="tun"`` ``tun0``, joined by
    :mod:`frugalrl.tunlink`'s forwarding process, which adds the delay where the kernel has no netem (the
    default link where a delay is given and netem is missing); ``rate``, ``delay``, ``loss`` and ``ingress`` are
    :meth:`shape`'s. Leaving the ``with`` block (even by an exception) kills processes started with
    :meth:`popen` and deletes every namespace; a failed setup does the same before raising.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self,
        n: int = 2,
        prefix: str = "frl",
        rate: Rate = None,
        delay: Delay = None,
        loss: Loss = None,
        tag: str | None = None,
        link: Link | None = None,
        ingress: bool = False,
    ) -> None:
        if not 2 <= n <= 254:
            raise ValueError(f"n must be in [2, 254], got {n}")
        _check_prefix(prefix)
        if link is None:
            link = default_link(delay is not None)
        if link not in ("veth", "tun"):
            raise ValueError(f"link must be 'veth' or 'tun', got {link!r}")
        self.link: Link = link
        self.dev = DEV if link == "veth" else TUN_DEV
        self.n = n
        self.prefix = prefix
        self.tag = tag if tag is not None else f"{os.getpid()}-{next(_counter)}"
        self.namespaces = [f"{prefix}-{self.tag}-h{i}" for i in range(n)]
        self.switch = f"{prefix}-{self.tag}-sw" if n > 2 and link == "veth" else None
        self._forwarder: subprocess.Popen[bytes] | None = None
        self._shaping: dict[str, Any] = {"rate": rate, "delay": delay, "loss": loss, "ingress": ingress}
        self._procs: list[subprocess.Popen[Any]] = []
        self._up = False

    # -- lifecycle

    def __enter__(self) -> TestHosts:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def setup(self) -> None:
        """Create namespaces, links, addresses and shaping; on any failure undo everything and raise."""
        ok, why = netns_available()
        if not ok:
            raise RuntimeError(f"network namespaces unavailable: {why}")
        try:
            self._up = True
            for ns in [*self.namespaces, *([self.switch] if self.switch else [])]:
                _cmd(["ip", "netns", "add", ns])
                _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
            if self.link == "tun":
                self._start_forwarder()
            elif self.switch is None:
                a, b = self.namespaces
                _cmd(["ip", "link", "add", DEV, "netns", a, "type", "veth", "peer", "name", DEV, "netns", b])
            else:
                sw = self.switch
                _cmd(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
                _cmd(["ip", "-n", sw, "link", "set", "br0", "up"])
                for i, ns in enumerate(self.namespaces):
                    port = f"p{i}"
                    veth = ["type", "veth", "peer", "name", port, "netns", sw]
                    _cmd(["ip", "link", "add", DEV, "netns", ns, *veth])
                    _cmd(["ip", "-n", sw, "link", "set", port, "master", "br0"])
                    _cmd(["ip", "-n", sw, "link", "set", port, "up"])
            for i, ns in enumerate(self.namespaces):
                _cmd(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", self.dev])
                _cmd(["ip", "-n", ns, "link", "set", self.dev, "up"])
            self.shape(**self._shaping)
        except BaseException:
            self.teardown()
            raise

    def _start_forwarder(self) -> None:
        """Start :mod:`frugalrl.tunlink` on our namespaces and wait for its ``ready`` (its devices exist then)."""
        config = {"namespaces": self.namespaces, "dev": self.dev, "subnet": SUBNET, "delays": [0.0] * self.n}
        proc = self._forwarder = subprocess.Popen([sys.executable, "-m", "frugalrl.tunlink", json.dumps(config)],
                                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], _CMD_TIMEOUT)
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":  # setup's teardown stops it
            code = proc.poll()
            raise RuntimeError("the TUN forwarder did not start" + (f" (exit code {code})" if code is not None else
                                                                     f" within {_CMD_TIMEOUT:g} s"))

    def _stop_forwarder(self) -> None:
        proc, self._forwarder = self._forwarder, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # it exits when its stdin closes
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def teardown(self) -> None:
        """Kill our :meth:`popen` processes still running, stop the TUN forwarder and delete all our namespaces
        (idempotent)."""
        for p in self._procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self._procs.clear()
        self._stop_forwarder()
        if self._up:
            for ns in [*self.namespaces, *([self.switch] if self.switch else [])]:
                _delete_namespace(ns)
            self._up = False

    # -- use

    def address(self, i: int) -> str:
        """IPv4 address of host ``i`` (0-based): ``10.213.0.{i+1}``."""
        if not 0 <= i < self.n:
            raise IndexError(f"host index {i} out of range for {self.n} hosts")
        return f"{SUBNET}.{i + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        """The argv prefix that runs a command inside host ``i``: ``ip netns exec NS``."""
        self.address(i)  # range check
        return ["ip", "netns", "exec", self.namespaces[i]]

    def run(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run(argv, **kwargs)`` inside host ``i`` (pass ``timeout=`` to bound it)."""
        return subprocess.run([*self.exec_prefix(i), *argv], **kwargs)

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(argv, **kwargs)`` inside host ``i``; killed at :meth:`teardown` if still running."""
        p = subprocess.Popen([*self.exec_prefix(i), *argv], **kwargs)
        self._procs.append(p)
        return p

    def shape(
        self, rate: Rate = None, delay: Delay = None, loss: Loss = None, hosts: Sequence[int] | None = None,
        ingress: bool = False,
    ) -> None:
        """Replace the shaping on the interface of each host in ``hosts`` (default: all); all ``None`` = unshaped.

        Egress of every host is shaped, so ``delay`` is one way and a round trip gains ``2 * delay`` (on a TUN
        link the forwarder holds each packet for its sender's delay; ``tc`` shapes rate and loss either way).
        ``ingress`` also limits what reaches each host to ``rate``: the switch's port toward it (the bridge's, or
        the TUN forwarder's), which all the other hosts' traffic to it shares, as at a real NIC. Without it, three
        or more hosts each send at ``rate`` and a host receives their sum (two hosts: the same either way).
        """
        port_rate = parse_rate(rate) if ingress and rate is not None else None
        for i in range(self.n) if hosts is None else hosts:
            self.address(i)
            if self.link == "tun":
                apply_shaping(self.namespaces[i], self.dev, rate=rate, loss=loss)
                self._tell_forwarder(f"delay {i} {parse_delay(delay) if delay is not None else 0.0}")
                self._tell_forwarder(f"rate {i} {port_rate or 0}")
            else:
                apply_shaping(self.namespaces[i], self.dev, rate=rate, delay=delay, loss=loss)
                if self.switch is not None:  # the bridge's port toward host i: its egress is the host's ingress
                    apply_shaping(self.switch, f"p{i}", rate=port_rate)
        if hosts is None:
            self._shaping = {"rate": rate, "delay": delay, "loss": loss, "ingress": ingress}


    def _tell_forwarder(self, line: str) -> None:
        proc = self._forwarder
        if proc is None or proc.stdin is None or proc.poll() is not None:
            raise RuntimeError("the TUN forwarder is not running")
        proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()


# ---------------------------------------------------------------------------------------- cleanup


def _sets(prefix: str) -> dict[str, list[str]]:
    """Namespaces of ``prefix`` grouped by tag (``{pid}-{k}`` or ``cli``)."""
    pat = re.compile(rf"^{re.escape(prefix)}-((?:\d+-\d+)|{CLI_TAG})-(?:h\d+|sw)$")
    sets: dict[str, list[str]] = {}
    for ns in list_namespaces():
        m = pat.match(ns)
        if m:
            sets.setdefault(m.group(1), []).append(ns)
    return sets


def cleanup_stale(prefix: str = "frl", everything: bool = False) -> list[str]:
    """Delete namespace sets of ``prefix`` whose creating process is dead; return the names deleted.

    With ``everything=True`` also delete sets of live processes and the CLI set (``{prefix}-cli-*``).
    """
    _check_prefix(prefix)
    deleted: list[str] = []
    for tag, names in _sets(prefix).items():
        if tag == CLI_TAG:
            stale = everything
        else:
            pid = int(tag.split("-")[0])
            stale = everything or (pid != os.getpid() and not _pid_alive(pid))
        if stale:
            for ns in names:
                _delete_namespace(ns)
                deleted.append(ns)
    return deleted


# -------------------------------------------------------------------------------------------- CLI


def _cli_hosts(prefix: str) -> list[str]:
    names = _sets(prefix).get(CLI_TAG, [])
    return sorted((ns for ns in names if not ns.endswith("-sw")), key=lambda s: int(s.rsplit("h", 1)[1]))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m frugalrl.netem {check,up,down,shape,list,cleanup}``; see the module docstring."""
    try:
        return _main(argv)
    except (ShapingUnavailable, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m frugalrl.netem", description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", default="frl", help="namespace name prefix (default: frl)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="can namespaces and netem be used here?")
    shaping = argparse.ArgumentParser(add_help=False)
    shaping.add_argument("--rate", help="e.g. 10mbit (tbf)")
    shaping.add_argument("--delay", help="one-way delay, e.g. 20ms (netem)")
    shaping.add_argument("--loss", help="percent dropped on egress, e.g. 1 or 1%%")
    shaping.add_argument("--ingress", action="store_true",
                         help="the rate also on the switch port toward each host (what all others send it shares)")
    up = sub.add_parser("up", parents=[shaping], help="create persistent hosts {prefix}-cli-h{i}")
    up.add_argument("-n", type=int, default=2, help="number of hosts (default 2)")
    sub.add_parser("down", help="delete the hosts made by 'up'")
    sub.add_parser("shape", parents=[shaping], help="replace the shaping of the 'up' hosts")
    sub.add_parser("list", help="list this prefix's namespaces")
    cl = sub.add_parser("cleanup", help="delete sets left by dead processes")
    cl.add_argument("--all", action="store_true", help="delete every set of this prefix, live or not")
    args = ap.parse_args(argv)

    if args.cmd == "check":
        ok, why = netns_available()
        print(f"namespaces: {'yes' if ok else 'no: ' + why}")
        nok, nwhy = netem_available()
        print(f"netem (delay, loss): {'yes' if nok else 'no: ' + nwhy}")
        if not nok:
            tun = os.path.exists("/dev/net/tun")
            print(f"TUN links (TestHosts(link='tun'): delay in a forwarding process): {'yes' if tun else 'no'}")
        return 0 if ok else 1
    if args.cmd == "list":
        for tag, names in sorted(_sets(args.prefix).items()):
            print(tag, " ".join(sorted(names)))
        return 0
    if args.cmd == "cleanup":
        for ns in cleanup_stale(args.prefix, everything=args.all):
            print("deleted", ns)
        return 0
    if args.cmd == "down":
        for tag, names in _sets(args.prefix).items():
            if tag == CLI_TAG:
                for ns in names:
                    _delete_namespace(ns)
                    print("deleted", ns)
        return 0
    if args.cmd in ("up", "shape") and args.ingress and args.rate is None:
        print("error: --ingress limits the switch ports to --rate: give a --rate", file=sys.stderr)
        return 1
    if args.cmd == "up":
        if _sets(args.prefix).get(CLI_TAG):
            print(f"{args.prefix}-{CLI_TAG}-* already exist; run 'down' first", file=sys.stderr)
            return 1
        # veth: a TUN link's forwarder lives only as long as the TestHosts object that started it
        hosts = TestHosts(args.n, args.prefix, args.rate, args.delay, args.loss, tag=CLI_TAG, link="veth",
                          ingress=args.ingress)
        hosts.setup()  # no teardown: they persist until 'down'
        for i, ns in enumerate(hosts.namespaces):
            print(f"{ns} {hosts.address(i)}  (ip netns exec {ns} CMD)")
        return 0
    if args.cmd == "shape":
        names = _cli_hosts(args.prefix)
        if not names:
            print(f"no {args.prefix}-{CLI_TAG}-h* hosts; run 'up' first", file=sys.stderr)
            return 1
        TestHosts(len(names), args.prefix, tag=CLI_TAG, link="veth").shape(args.rate, args.delay, args.loss,
                                                                           ingress=args.ingress)
        return 0
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
