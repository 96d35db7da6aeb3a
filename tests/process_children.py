"""Entry points of the child processes that tests/test_process.py starts (imported by those children)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from frugalrl.process import ParentGone, ParentLink, error_message
from frugalrl.wire.message import Message


def _build(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("fail") == "value":
        raise ValueError("a bad value in the config")
    if config.get("fail") == "other":
        raise KeyError("missing")
    if config.get("hang"):
        time.sleep(600)
    return config


def echo_entry() -> None:
    """Answer each request: ``env`` (some variables), ``grandchild`` (start one, in this process group),
    ``exit`` (with meta ``code``), ``sigint`` (SIGINT to itself first); anything else is echoed."""
    link = ParentLink.from_argv()
    try:
        config = link.start(_build, ready={"pid": os.getpid()})
        if config is None:
            return
        while True:
            msg = link.recv()
            if msg.op == "exit":
                os._exit(int(msg.meta["code"]))
            if msg.op == "env":
                keys = ("PYTHONPATH", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
                link.send(Message("env", {k: os.environ.get(k) for k in keys}))
            elif msg.op == "grandchild":
                proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                link.send(Message("grandchild", {"pid": proc.pid}))
            elif msg.op == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                link.send(Message("alive"))
            else:
                link.send(msg)
    except ParentGone:
        return


def head_entry() -> None:
    """A parent that starts an echo child, prints its pid, and then waits to be killed."""
    from frugalrl.process import spawn

    child = spawn("process_children:echo_entry", {}, name="grandchild")
    child.await_ready(time.monotonic() + 60)
    print(child.pid, flush=True)
    time.sleep(600)


def stage_entry() -> None:
    """A long-running child: computes for ``seconds`` (its parent watched from a thread), prints a line,
    then reports ``done`` or, with ``fail``, a ValueError; it ends when its parent closes the connection."""
    link = ParentLink.from_argv()
    try:
        config = link.start(dict)
        if config is None:
            return
        link.watch_parent()
        time.sleep(float(config["seconds"]))
        print(f"stage {config['rank']} finished", flush=True)
        if config.get("fail"):
            link.send(error_message(ValueError(f"stage {config['rank']} went wrong")))
        else:
            link.send(Message("done", {"rank": config["rank"]}))
        link.recv()
    except ParentGone:
        return
