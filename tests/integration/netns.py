"""Hosts of their own: each gateway and worker of a test in a Linux network namespace (issue 16).

One `Network` per test, with a run id `R` (six hex digits) and a /24 chosen free at start:

    root namespace                                        namespace tenure-hosts-R-<host>
    bridge thRbr 10.A.B.1/24                              lo, eth0 10.A.B.(10+i)/24
      ├── thRv<i>  ══════ veth pair ═════════════════════ eth0
      ├── TcpForwarder 10.A.B.1:<port> → 127.0.0.1:5432   (the system PostgreSQL listens on loopback only and
      │                                                    its configuration is never changed by a test)
      └── redis-server bound to 10.A.B.1 (RedisProc(bind=...))

The test process itself stays in the root namespace and reaches every host at its address over the bridge.

Faults:

- `Host.cut()` / `Host.heal()`: `ip link set thRv<i> down/up`, the bridge's end of the host's cable. Inside the
  host the link loses its carrier but keeps its address and route, so every packet in either direction is
  dropped in silence: open TCP connections stall (no RST, no ICMP), new ones time out, and when the link comes
  back TCP retransmits what was pending, so a request sent during the cut reaches the server late. That is a
  pulled cable or a dead switch port; downing the host's own end instead would remove its route and make every
  send fail at once, which no remote failure looks like. (netem is not built into this kernel.)
- `Host.block(address, port)` / `Host.unblock()`: an nftables table inside the host's namespace that drops the
  packets between the host and one service in both directions (a partition between two hosts only): the host
  still reaches everything else, everyone else still reaches the service.

Cleanup: `Network.close()` kills every process left in a namespace, deletes the veths, the namespaces and the
bridge, and raises if anything of the run remains. It is idempotent and runs from fixture teardown, so a failing
test cleans up too. A run records its owner (pid and start time) in /run/tenure-hosts/R; every new `Network`
first removes the namespaces and links of runs whose owner is dead (a crashed or SIGKILLed test run). Parallel
runs never collide: names carry the run id, and the /24 is checked against every address and route in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from tests.conftest import PYTHON
from tests.integration.procs import TenureProc

NS_PREFIX = "tenure-hosts-"
LINK_PREFIX = "th"
REGISTRY = Path("/run/tenure-hosts")
_NS_RE = re.compile(rf"^{NS_PREFIX}([0-9a-f]{{6}})-")
_LINK_RE = re.compile(rf"^{LINK_PREFIX}([0-9a-f]{{6}})(br|v\d+)$")
_NFT_TABLE = "tenure_partition"


def require_tools() -> None:
    """Fail loudly (never skip) when the tools the namespace tests need are missing: scripts/ensure-tools.sh
    installs them (`make test` runs it)."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    assert not missing, f"{', '.join(missing)} missing: run scripts/ensure-tools.sh (iproute2, nftables)"
    assert os.geteuid() == 0, "the namespace tests create network namespaces: they must run as root"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one command (`ip`, `nft`); with `check`, a failure raises with its stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _ip_json(*argv: str) -> list[dict[str, object]]:
    out = run("ip", "-j", *argv).stdout.strip()
    return json.loads(out) if out else []


# -- owners of runs ----------------------------------------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), which tells a pid reused by another
    process from the one that made a run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(run_id: str) -> bool:
    try:
        owner = json.loads((REGISTRY / run_id).read_text())
    except (OSError, ValueError):
        return False
    return _start_time(int(owner["pid"])) == owner["start"]


def namespaces() -> list[str]:
    """The names of every network namespace (`ip netns list`)."""
    return [str(n["name"]) for n in _ip_json("netns", "list")]


def links() -> list[str]:
    """The names of every link of the root namespace."""
    return [str(link["ifname"]) for link in _ip_json("link", "show")]


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL whatever still runs in `ns` (a namespace lives on, with its veth, while a process is in it)."""
    deadline = time.monotonic() + 10
    while True:
        pids = [int(p) for p in run("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of namespace {ns} survive SIGKILL")
        time.sleep(0.05)


def _remove(ns_names: Sequence[str], link_names: Sequence[str]) -> None:
    """Kill the namespaces' processes, then delete the veths (either end deletes the pair), the namespaces and the
    bridges. Every step tolerates what is already gone."""
    for ns in ns_names:
        _kill_namespace_processes(ns)
    ordered = sorted(link_names, key=lambda name: name.endswith("br"))  # veths before their bridge
    for name in ordered:
        run("ip", "link", "del", name, check=False)
    for ns in ns_names:
        run("ip", "netns", "del", ns, check=False)


def sweep_leftovers() -> list[str]:
    """Remove the namespaces and links of earlier runs whose owner is dead; what was removed."""
    stale_ns = [n for n in namespaces() if (m := _NS_RE.match(n)) and not _owner_alive(m.group(1))]
    stale_links = [n for n in links() if (m := _LINK_RE.match(n)) and not _owner_alive(m.group(1))]
    _remove(stale_ns, stale_links)
    if REGISTRY.is_dir():
        for record in REGISTRY.iterdir():
            if not _owner_alive(record.name):
                record.unlink(missing_ok=True)
    return stale_ns + stale_links


# -- the network -------------------------------------------------------------------------------------------------
@dataclass
class Host:
    """One host: a network namespace with one veth to the bridge and an address of its own."""

    name: str
    ns: str
    address: str
    veth: str  # the bridge's end, in the root namespace
    network: Network = field(repr=False)
    cut_at: float | None = None
    healed_at: float | None = None

    @property
    def wrap(self) -> tuple[str, ...]:
        """The argv prefix that runs a command on this host."""
        return ("ip", "netns", "exec", self.ns)

    def cut(self) -> None:
        """Pull the cable: every packet to or from this host is dropped in silence (see the module docstring)."""
        run("ip", "link", "set", self.veth, "down")
        self.cut_at = time.time()

    def heal(self) -> None:
        """Plug the cable back: what TCP kept pending is retransmitted."""
        run("ip", "link", "set", self.veth, "up")
        self.healed_at = time.time()

    def block(self, address: str, port: int) -> None:
        """Drop the packets between this host and `address:port`, both ways (a partition of these two only)."""
        rules = (
            f"table inet {_NFT_TABLE} {{\n"
            "  chain out { type filter hook output priority 0; policy accept;\n"
            f"    ip daddr {address} tcp dport {port} drop\n  }}\n"
            "  chain in { type filter hook input priority 0; policy accept;\n"
            f"    ip saddr {address} tcp sport {port} drop\n  }}\n"
            "}\n"
        )
        done = subprocess.run([*self.wrap, "nft", "-f", "-"], input=rules, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"nft on {self.ns} failed: {done.stderr.strip()}")

    def unblock(self) -> None:
        """End the partitions of `block`."""
        run(*self.wrap, "nft", "delete", "table", "inet", _NFT_TABLE)

    def reaches(self, address: str, port: int, timeout_s: float = 2.0) -> bool:
        """Whether a TCP connection from this host to `address:port` is accepted within `timeout_s`."""
        probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout={timeout_s}).close()"
        done = subprocess.run([*self.wrap, PYTHON, "-c", probe], capture_output=True, timeout=timeout_s + 30)
        return done.returncode == 0


class Network:
    """A bridge in the root namespace and hosts attached to it (see the module docstring). A context manager;
    `close()` is idempotent and raises if anything of the run is left."""

    def __init__(self) -> None:
        require_tools()
        self.swept = sweep_leftovers()
        self.run_id = secrets.token_hex(3)
        self.bridge = f"{LINK_PREFIX}{self.run_id}br"
        self.hosts: dict[str, Host] = {}
        self._closed = False
        REGISTRY.mkdir(parents=True, exist_ok=True)
        # The owner is recorded before anything is created: a resource whose run has no live owner is a leftover.
        (REGISTRY / self.run_id).write_text(json.dumps({"pid": os.getpid(), "start": _start_time(os.getpid())}))
        try:
            run("ip", "link", "add", "name", self.bridge, "type", "bridge")
            self.subnet = self._claim_subnet()
            self.gateway = str(self.subnet.network_address + 1)
            run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def _claim_subnet(self) -> ipaddress.IPv4Network:
        """A /24 in 10.128.0.0/9 that no address or route of the machine overlaps, assigned to the bridge (and
        checked again after, in case a parallel run chose the same one at the same moment)."""
        rng = random.Random()
        for _ in range(50):
            subnet = ipaddress.IPv4Network(f"10.{rng.randrange(128, 255)}.{rng.randrange(0, 256)}.0/24")
            if self._in_use(subnet):
                continue
            run("ip", "addr", "add", f"{subnet.network_address + 1}/24", "dev", self.bridge)
            if self._in_use(subnet, besides=self.bridge):
                run("ip", "addr", "flush", "dev", self.bridge)
                continue
            return subnet
        raise RuntimeError("no free /24 in 10.128.0.0/9")

    @staticmethod
    def _in_use(subnet: ipaddress.IPv4Network, besides: str | None = None) -> bool:
        for link in _ip_json("-4", "addr", "show"):
            if link["ifname"] == besides:
                continue
            for a in link.get("addr_info", []):  # type: ignore[attr-defined]
                if ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False).overlaps(subnet):
                    return True
        for route in _ip_json("-4", "route", "show"):
            dst = str(route["dst"])
            if (
                dst != "default"
                and route.get("dev") != besides
                and ipaddress.IPv4Network(dst, strict=False).overlaps(subnet)
            ):
                return True
        return False

    def add_host(self, name: str) -> Host:
        """A new namespace `tenure-hosts-R-<name>` with its veth on the bridge, an address, lo and eth0 up."""
        index = len(self.hosts)
        host = Host(
            name=name,
            ns=f"{NS_PREFIX}{self.run_id}-{name}",
            address=str(self.subnet.network_address + 10 + index),
            veth=f"{LINK_PREFIX}{self.run_id}v{index}",
            network=self,
        )
        self.hosts[name] = host
        run("ip", "netns", "add", host.ns)
        # The peer is created inside the namespace directly: no end of it ever sits in the root namespace unnamed.
        run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        run("ip", "link", "set", host.veth, "master", self.bridge)
        run("ip", "link", "set", host.veth, "up")
        run("ip", "-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        run("ip", "-n", host.ns, "link", "set", "eth0", "up")
        run("ip", "-n", host.ns, "link", "set", "lo", "up")
        return host

    def remaining(self) -> list[str]:
        """The namespaces and links of this run that still exist."""
        mine = f"{LINK_PREFIX}{self.run_id}"
        return [n for n in namespaces() if n.startswith(f"{NS_PREFIX}{self.run_id}-")] + [
            n for n in links() if n.startswith(mine)
        ]

    def close(self) -> None:
        """Kill what runs on the hosts, remove every namespace and link of the run; raise if any remains."""
        mine = f"{LINK_PREFIX}{self.run_id}"
        ns_names = [n for n in namespaces() if n.startswith(f"{NS_PREFIX}{self.run_id}-")]
        _remove(ns_names, [n for n in links() if n.startswith(mine)])
        left = self.remaining()
        if not left:
            (REGISTRY / self.run_id).unlink(missing_ok=True)
            self._closed = True
        assert not left, f"the network of run {self.run_id} was not removed: {left}"

    def __enter__(self) -> Network:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


# -- services over the bridge ------------------------------------------------------------------------------------
class TcpForwarder:
    """A TCP forwarder in the root namespace: `listen_host:port` → `target`, on an event loop of its own thread
    (so the test's loop, busy or blocked, never delays a host's database traffic). Counts the bytes received
    from each peer address and when the last ones came, which shows a host talking again after a cut."""

    def __init__(self, listen_host: str, target: tuple[str, int]) -> None:
        self._target = target
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self.received: dict[str, int] = {}
        self.last_received: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, args=(listen_host,), name="tcp-forwarder", daemon=True)
        self._thread.start()
        if not self._started.wait(10) or self._error is not None:
            raise RuntimeError(f"the forwarder did not start: {self._error!r}")

    def _run(self, host: str) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve(host))
        except BaseException as exc:
            self._error = exc
            self._started.set()
        finally:
            self._loop.close()

    async def _serve(self, host: str) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, host, 0)
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        await self._stop.wait()
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        peer = str(writer.get_extra_info("peername")[0])
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
            except OSError:
                return
            try:
                await asyncio.gather(self._pump(reader, up_writer, peer), self._pump(up_reader, writer, None))
            finally:
                up_writer.close()
        finally:
            writer.close()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str | None) -> None:
        try:
            while data := await reader.read(65536):
                if peer is not None:
                    self.received[peer] = self.received.get(peer, 0) + len(data)
                    self.last_received[peer] = time.time()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()  # the other direction ends too: its reader sees the close

    def close(self) -> None:
        """Stop listening and close every forwarded connection. Idempotent."""
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)


class GatewayProc(TenureProc):
    """`tenure gateway` on a host, bound to the host's address (API keys required off loopback)."""

    def __init__(self, host: Host, database_url: str, log_dir: Path, name: str, *, app: str, env: dict[str, str],
                 port: int = 8000) -> None:  # fmt: skip
        argv = ["gateway", "--app", app, "--host", host.address, "--port", str(port)]
        super().__init__(database_url, log_dir, name, argv, env=env, wrap=host.wrap)
        self.url = f"http://{host.address}:{port}"

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"gateway {self.name} exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"gateway {self.name} not ready after {timeout_s}s:\n{self.log()}")


@contextlib.contextmanager
def stopping(procs: list[TenureProc]) -> Iterator[list[TenureProc]]:
    """Yield `procs`; SIGKILL every one of them afterwards, whatever happened."""
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.stop()
