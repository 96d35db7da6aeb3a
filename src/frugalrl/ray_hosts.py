"""A Ray cluster in :class:`frugalrl.netem.TestHosts` network namespaces: the Ray head in host 0 (0 CPUs, no
dashboard), one Ray worker node in each other host (two hosts: one worker node). The multinode tests and the link
benchmarks (``hsa2c_link.py``, ``shaped_links.py``) run drivers inside host 0, so every actor lands on a worker host
and every call crosses host 0's link, the learner's.

The cluster uses its own temp dir and a fresh auth token (Ray's token authentication is on by default), and is torn
down by killing exactly the processes inside its two namespaces: ``ray stop --force`` is not namespace-scoped
(namespaces share the PID space), so it would kill every Ray process on the machine. Needs root, iproute2 and ray.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import tempfile
import time

from frugalrl import netem

# The `ray` command of this interpreter (a venv's bin/ is not always on PATH).
RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
if not os.path.exists(RAY_CLI):
    RAY_CLI = shutil.which("ray") or "ray"

START_TIMEOUT = 90.0


def netns_pids(ns: str) -> list[int]:
    """Processes whose network namespace is ``ns`` (what ``ray start`` left running there)."""
    try:
        ino = os.stat(f"/var/run/netns/{ns}").st_ino
    except OSError:
        return []
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}/ns/net").st_ino == ino:
                    pids.append(int(name))
            except OSError:
                pass
    return pids


def kill_netns(ns: str, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, every process in namespace ``ns``; bounded by ``grace`` + 5 s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pids = netns_pids(ns)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while netns_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not netns_pids(ns):
            return


class RayCluster:
    """Ray head in host 0 (0 CPUs, no dashboard), a worker node with ``worker_cpus`` CPUs in each of hosts 1 … n-1."""

    def __init__(self, hosts: netem.TestHosts, worker_cpus: int = 2) -> None:
        self.hosts = hosts
        self.worker_cpus = worker_cpus
        self.tmp = tempfile.mkdtemp(prefix="frlray", dir="/tmp")  # short: Ray's unix socket paths are limited
        self.env = dict(
            os.environ,
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=secrets.token_hex(32),
            PYTHONUNBUFFERED="1",
        )
        self.port = 0
        self.address = ""

    def _free_port(self) -> int:
        code = "import socket; s = socket.socket(); s.bind(('10.213.0.1', 0)); print(s.getsockname()[1])"
        out = self.hosts.run(0, [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
        return int(out.stdout.strip())

    def _ray_start(self, i: int, args: list[str]) -> None:
        common = ["--disable-usage-stats", f"--temp-dir={self.tmp}/h{i}", "--object-store-memory=100000000"]
        proc = self.hosts.run(i, [RAY_CLI, "start", *args, *common], capture_output=True, text=True,
                              timeout=START_TIMEOUT, env=self.env)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start in host {i} failed: {proc.stderr[-2000:]}")

    def start_head(self) -> None:
        self.port = self._free_port()
        self.address = f"{self.hosts.address(0)}:{self.port}"
        self._ray_start(0, ["--head", f"--node-ip-address={self.hosts.address(0)}", f"--port={self.port}",
                            "--num-cpus=0", "--include-dashboard=false"])

    def start_worker(self, i: int = 1) -> None:
        """Start the Ray worker node of host ``i``."""
        self._ray_start(i, [f"--address={self.address}", f"--node-ip-address={self.hosts.address(i)}",
                            f"--num-cpus={self.worker_cpus}"])

    def start(self) -> RayCluster:
        try:
            self.start_head()
            for i in range(1, self.hosts.n):
                self.start_worker(i)
        except BaseException:
            self.stop()
            raise
        return self

    def stop_host(self, i: int) -> None:
        kill_netns(self.hosts.namespaces[i])

    def stop(self) -> None:
        for i in reversed(range(self.hosts.n)):
            self.stop_host(i)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
