"""A Ray cluster on this machine for tests and benchmarks: a head and worker nodes started as
``ray start --block`` processes, as on a real cluster, each with its own directory standing
for its local disk (``OPGUARD_NODE_ROOT``: a run directory /runs/a is read there as
ROOT/runs/a) and a custom resource naming it (``opguard-node-K``).

Everything it starts runs in sessions of its own and is ended by their ids (never ``ray
stop``, which would end every Ray process of the machine, other people's included); ports are
found free, the temporary directory is its own, so clusters of parallel tests never meet.
It lives in ``tests/`` (test code); the benchmark puts ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from opguard.distributed.holdings import NODE_ROOT_ENV

STARTED = "Ray runtime started."  # what `ray start` prints once its node is up
START_TIMEOUT_S = 120.0
OBJECT_STORE_BYTES = 80 << 20  # per node (Ray's least is 75 MiB)
TESTS = str(Path(__file__).resolve().parent)
FAST_FAILURE_DETECTION = {
    "RAY_health_check_initial_delay_ms": "500",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One node: its ``ray start`` process, its directory, its log."""

    name: str
    root: Path
    process: subprocess.Popen[bytes]
    log: Path

    def local(self, path: Path) -> Path:
        """Where this node holds what the training wrote at ``path`` (absolute)."""
        return self.root / str(path).lstrip(os.sep)


class LocalCluster:
    """A head and ``workers`` worker nodes, each with ``cpus`` CPUs; :meth:`stop` (or the
    ``with`` block's end) ends every process started."""

    def __init__(self, workers: int = 2, *, cpus: int = 1) -> None:
        # Short: Ray's Unix sockets live under it, and a socket's path is at most 107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="ogray-", dir="/tmp"))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.cpus = cpus
        self.nodes: list[Node] = []
        try:
            self._start("n0", head=True)
            for k in range(1, workers + 1):
                self._start(f"n{k}", head=False)
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, *, head: bool) -> None:
        root = self.dir / name
        root.mkdir()
        ray = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block"]
        head_options = ["--head", "--port", str(self.port), "--temp-dir", str(self.dir / "ray")]
        where = (
            [*head_options, "--include-dashboard", "false"] if head else ["--address", self.address]
        )
        ports = ["--dashboard-agent-listen-port", "--dashboard-agent-grpc-port"]
        ports += ["--runtime-env-agent-port", "--metrics-export-port"]
        options = [
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            str(self.cpus),
            "--resources",
            json.dumps({f"opguard-node-{name}": 1}),
            "--object-store-memory",
            str(OBJECT_STORE_BYTES),
            "--disable-usage-stats",
            *(word for flag in ports for word in (flag, str(free_port()))),
        ]
        log = self.dir / f"{name}.log"
        env = {**os.environ, NODE_ROOT_ENV: str(root), "RAY_USAGE_STATS_ENABLED": "0"}
        # Workers import tests/ray_faults.py (a fault planted in them), and a node gone is
        # found in a second or two, not the half minute a real cluster waits for one.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
        env.update(FAST_FAILURE_DETECTION)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*ray, *where, *options],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.dir,
                start_new_session=True,  # its own session: ended by its id
            )
        node = Node(name, root, process, log)
        self.nodes.append(node)
        self._wait(node)

    def _wait(self, node: Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while STARTED not in node.log.read_text(errors="replace"):
            if node.process.poll() is not None or time.monotonic() > deadline:
                tail = node.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"ray start of node {node.name} failed:\n{tail}")
            time.sleep(0.2)

    def kill(self, node: Node) -> None:
        """Ends a node at once, as a machine that goes away: every process of its session."""
        _kill_session(node.process.pid)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            _kill_session(node.process.pid)
        for node in self.nodes:
            node.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_session(sid: int) -> None:
    """SIGKILL to every process of session ``sid`` (a node's ``ray start`` and what it
    started: the raylet, its agents and workers, which may sit in groups of their own)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
