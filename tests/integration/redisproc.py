"""A private `redis-server` for the tests that restart or flush Redis: the shared server on 6379 is used by
other test runs and must never be flushed. Started on a free port, without persistence, killed afterwards."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RedisProc:
    """One redis-server process on a fixed port, which `restart()` keeps; bound to `bind` (loopback, or the
    bridge of a test network: tests/integration/netns.py)."""

    def __init__(self, workdir: Path, bind: str = "127.0.0.1") -> None:
        self.bind = bind
        self.port = free_port(bind)
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://{self.bind}:{self.port}/0"

    def start(self) -> None:
        server = shutil.which("redis-server")
        assert server is not None, "redis-server is not installed"
        self.proc = subprocess.Popen(
            [
                server,
                "--port",
                str(self.port),
                "--bind",
                self.bind,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                # Off loopback (a test network's bridge, reached only by that test's own hosts) protected mode
                # would refuse every client.
                *(() if self.bind == "127.0.0.1" else ("--protected-mode", "no")),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((self.bind, self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError("the private redis-server did not start")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def flushall(self) -> None:
        with socket.create_connection((self.bind, self.port), timeout=2) as s:
            s.sendall(b"FLUSHALL\r\n")
            assert s.recv(16).startswith(b"+OK")
