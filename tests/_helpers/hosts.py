"""Hosts of their own on this machine: network namespaces on a bridge, each with its own address,
and a Ray cluster across them (a head on one, raylets on the others).

A fake Ray cluster (``ray.cluster_utils.Cluster``) runs every node on one address, and a lost
node there is a process killed cleanly: every socket closes at once. Real machines fail otherwise:
a link goes down and the packets just stop, no FIN, no RST. :class:`Hosts` builds N hosts whose
links can be cut (``cut``: the bridge's end of the host's cable goes down, the host keeps its
address and its sockets, and nothing it sends arrives) and healed again, lists each host's
processes (they share the machine's process list; a process belongs to the host whose network
namespace it is in) and kills them by pid. :class:`RayHosts` starts Ray on them: each node with
its own ``--temp-dir`` (its sockets apart) and ``RAY_AUTH_MODE=disabled`` (Ray 2.60 turns token
authentication on for a head where ``~/.ray/auth_token`` exists, and the joining nodes then
fail with ``InvalidAuthToken``). ``ray stop`` is never used: it stops every Ray of the machine.

Everything is named with one prefix (``phx41``) and one private subnet (``10.213.41.0/24``); one
set of hosts of a prefix exists at a time on the machine (an ``flock`` per prefix), so whatever
carries the prefix when the lock is taken is a leftover of a run that crashed, and is removed
first. ``close`` removes everything the hosts made, by pid and by name, whatever the test did;
``restore`` heals every link and ends what was started on the hosts, so that one cluster can
serve many tests (tests/hosts/conftest.py).

Example::

    with Hosts(4) as hosts, RayHosts(hosts, cpus={1: 2, 2: 2, 3: 2}) as ray_hosts:
        driver = hosts.popen(0, ["python", "driver.py", ray_hosts.address])
        hosts.cut(2)  # host 2's packets stop
        hosts.heal(2)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

PREFIX = "phx41"
SUBNET = "10.213.41"  # host i is SUBNET.(10 + i)/24
LOCK_PATH = "/tmp/phalanx_hosts.lock"
RAY_PORT = 6379
NETNS_DIR = "/run/netns"
UNAVAILABLE_REASON = "network namespaces cannot be made here"


def namespaces_unavailable() -> str | None:
    """Why hosts cannot be built on this machine (a skip reason), or None when they can."""
    if sys.platform != "linux":
        return f"{UNAVAILABLE_REASON}: not Linux"
    if shutil.which("ip") is None:
        return f"{UNAVAILABLE_REASON}: no ip(8) (iproute2)"
    if os.geteuid() != 0:
        return f"{UNAVAILABLE_REASON}: not root (ip netns needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"{UNAVAILABLE_REASON}: ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _netns_inode(name: str) -> int | None:
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_ino
    except OSError:
        return None


def pids_in_netns(inode: int) -> list[int]:
    """Every process whose network namespace is ``inode`` (never this process)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                found.append(int(entry))
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return sorted(found)


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def kill_pids(pids: Sequence[int], timeout_s: float = 10.0) -> None:
    """SIGKILL each pid, then wait until none of them is left (zombies of other parents count as
    gone: they hold no socket and run no code)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not [p for p in pids if _running(p)]:
            return
        time.sleep(0.02)
    raise RuntimeError(f"processes still running after SIGKILL: {[p for p in pids if _running(p)]}")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass(frozen=True)
class Host:
    index: int
    netns: str  # the network namespace's name
    address: str
    veth: str  # the bridge's end of the host's link (cut: down)


class Hosts:
    """``count`` hosts on one bridge (see the module docstring); a context manager."""

    def __init__(self, count: int, prefix: str = PREFIX, subnet: str = SUBNET) -> None:
        self.prefix = prefix
        self.bridge = f"{prefix}br"
        self.hosts = [
            Host(i, f"{prefix}-h{i}", f"{subnet}.{10 + i}", f"{prefix}v{i}") for i in range(count)
        ]
        self.temp_dir = f"/tmp/{prefix}"
        self.lock_path = LOCK_PATH if prefix == PREFIX else f"/tmp/phalanx_hosts_{prefix}.lock"
        self._lock: IO[str] | None = None
        self._started: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> Hosts:
        self._lock = open(self.lock_path, "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            remove_leftovers(self.prefix)
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def _build(self) -> None:
        os.makedirs(self.temp_dir, exist_ok=True)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            inside = f"{self.prefix}p{host.index}"
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", host.netns)
            _ip("link", "set", host.veth, "master", self.bridge)
            _ip("link", "set", host.veth, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "link", "set", inside, "name", "eth0")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")

    # -- running things on a host ---------------------------------------------------------------

    def argv(self, index: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run on host ``index`` (its pid is the command's: ip execs it)."""
        return ["ip", "netns", "exec", self.hosts[index].netns, *argv]

    def popen(self, index: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on host ``index``; ``close`` kills it if it still runs."""
        kwargs.setdefault("env", host_environment())
        process = subprocess.Popen(self.argv(index, argv), **kwargs)
        self._started.append(process)
        return process

    def run(self, index: int, argv: Sequence[str], timeout_s: float = 120.0) -> str:
        """Run ``argv`` on host ``index`` to its end; its output (raises if it fails)."""
        done = subprocess.run(
            self.argv(index, argv),
            env=host_environment(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv} on host {index} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    # -- the network ----------------------------------------------------------------------------

    def cut(self, index: int) -> None:
        """Host ``index``'s link goes down at the bridge: its packets stop, silently."""
        _ip("link", "set", self.hosts[index].veth, "down")

    def heal(self, index: int) -> None:
        _ip("link", "set", self.hosts[index].veth, "up")

    # -- processes ------------------------------------------------------------------------------

    def pids(self, index: int) -> list[int]:
        """The processes running on host ``index`` now."""
        inode = _netns_inode(self.hosts[index].netns)
        return [p for p in pids_in_netns(inode) if _running(p)] if inode is not None else []

    def processes(self, index: int) -> dict[int, str]:
        """pid -> command line of each process on host ``index``."""
        return {pid: command_line(pid) for pid in self.pids(index)}

    def restore(self) -> None:
        """Every link up again, every process ``popen`` started ended (killed if it still runs),
        and any phalanx or Ray Train worker left on a host killed: the hosts (and a Ray cluster
        on them, whose daemons ``run`` started) as a test found them."""
        for host in self.hosts:
            _ip("link", "set", host.veth, "up")
        for process in self._started:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        for process in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self._started.clear()
        left = [
            pid
            for host in self.hosts
            for pid, line in self.processes(host.index).items()
            if "PhalanxWorker" in line or "RayTrainWorker" in line
        ]
        kill_pids(left)

    def kill(self, index: int) -> None:
        """SIGKILL every process of host ``index`` (a machine that lost its power)."""
        kill_pids(self.pids(index))

    def close(self) -> None:
        """Kill every process of every host, remove the links, namespaces, bridge and temp
        files; release the lock. Safe to call more than once, and after a failed build."""
        try:
            for process in self._started:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            remove_leftovers(self.prefix)
            for process in self._started:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
            self._started.clear()
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        finally:
            if self._lock is not None:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()
                self._lock = None


def remove_leftovers(prefix: str) -> None:
    """Remove every namespace (after killing its processes), link and bridge named ``prefix``:
    called with the hosts' lock held, so they belong to no live test."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.startswith(f"{prefix}-")]
    for name in names:
        inode = _netns_inode(name)
        if inode is not None:
            kill_pids(pids_in_netns(inode))
        _ip("netns", "del", name, check=False)
    links = _ip("-o", "link", "show", check=False).stdout.split("\n")
    for line in links:
        parts = line.split(":")
        if len(parts) > 1:
            link = parts[1].strip().split("@")[0]
            if link.startswith(prefix):
                _ip("link", "del", link, check=False)


def host_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process started on a host: this one's, without a Ray address or
    phalanx settings of the test process, with token authentication off (see the module
    docstring), and ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "PHALANX_", "PYTEST_")) and k not in ("COV_CORE_SOURCE",)
    }
    env["RAY_AUTH_MODE"] = "disabled"
    env.update(extra or {})
    return env


class RayHosts:
    """A Ray cluster on ``hosts``: the head on host ``head`` (``head_cpus`` CPUs), a raylet with
    ``cpus[i]`` CPUs on each other host ``i``. ``address`` is the head's GCS address."""

    def __init__(
        self,
        hosts: Hosts,
        cpus: dict[int, int],
        head: int = 0,
        head_cpus: int = 0,
        system_config: str | None = None,
        resources: dict[int, dict[str, float]] | None = None,
    ) -> None:
        self.hosts = hosts
        self.head = head
        self.cpus = dict(cpus)
        self.resources = dict(resources or {})  # host -> its node's custom resources
        self.head_cpus = head_cpus
        self.system_config = system_config
        self.address = f"{hosts[head].address}:{RAY_PORT}"

    def __enter__(self) -> RayHosts:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def temp_dir(self, index: int) -> str:
        return f"{self.hosts.temp_dir}/ray{index}"

    def _start_args(self, index: int) -> list[str]:
        host = self.hosts[index]
        common = [
            "--node-ip-address",
            host.address,
            "--temp-dir",
            self.temp_dir(index),
            "--disable-usage-stats",
            # a Python process per node less to start: phalanx sends the workers' output itself
            "--include-log-monitor=false",
        ]
        if index in self.resources:
            common += ["--resources", json.dumps(self.resources[index])]
        if index == self.head:
            extra = ["--system-config", self.system_config] if self.system_config else []
            return [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                "start",
                "--head",
                "--port",
                str(RAY_PORT),
                "--num-cpus",
                str(self.head_cpus),
                "--include-dashboard=false",
                *common,
                *extra,
            ]
        return [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--address",
            self.address,
            "--num-cpus",
            str(self.cpus[index]),
            *common,
        ]

    def start(self) -> None:
        """The head, then every other node at once; returns once the GCS lists them all."""
        self.hosts.run(self.head, self._start_args(self.head))
        with ThreadPoolExecutor(len(self.cpus) or 1) as pool:
            list(pool.map(self._start_node, sorted(self.cpus)))
        self.wait_for_nodes(1 + len(self.cpus))

    def _start_node(self, index: int, tries: int = 3) -> None:
        """Start host ``index``'s raylet; on a loaded machine its registration with the GCS can
        miss Ray's deadline: then its processes are killed and it starts again."""
        for attempt in range(tries):
            try:
                self.hosts.run(index, self._start_args(index))
                return
            except RuntimeError:
                if attempt == tries - 1:
                    raise
                self.hosts.kill(index)

    def start_node(self, index: int) -> None:
        """Start host ``index``'s raylet again (after ``kill``)."""
        self.hosts.run(index, self._start_args(index))

    def wait_for_nodes(self, count: int, timeout_s: float = 60.0) -> None:
        script = (
            "import ray, sys, time\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
            f"deadline = time.monotonic() + {timeout_s}\n"
            f"while sum(n['Alive'] for n in ray.nodes()) < {count}:\n"
            "    if time.monotonic() > deadline: sys.exit('nodes did not join')\n"
            "    time.sleep(0.1)\n"
        )
        self.hosts.run(self.head, [sys.executable, "-c", script], timeout_s=timeout_s + 30)

    def revive(self) -> None:
        """Start again the raylet of every host that has none (Ray's GCS declared a host dead
        that was cut for longer than its health checks allow: its raylet then exits), so that
        the cluster has every node again."""
        lost = [
            i
            for i in sorted(self.cpus)
            if not any("/raylet" in line for line in self.hosts.processes(i).values())
        ]
        for index in lost:
            self.hosts.kill(index)
            self._start_node(index)
        if lost:
            self.wait_for_nodes(1 + len(self.cpus))

    def stop(self) -> None:
        """Kill every Ray process of every host (by pid: never ``ray stop``)."""
        for host in self.hosts.hosts:
            self.hosts.kill(host.index)


def last_json_line(out: str) -> dict:
    """The driver's result: its last line that is a JSON object (Ray's raylet may print its own
    lines, such as a worker's death, to the driver's stdout after it)."""
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"the driver printed no result:\n{out[-3000:]}")


# The cluster tests/hosts shares (tests/hosts/conftest.py): host 0 the Ray head (no CPUs), where
# drivers, the S3 server and the tools run; a 1-CPU raylet on each worker host, where the
# workers go (2 ranks, and room to place the lost ones of two cuts elsewhere). The last worker
# host is also the driver host, for a driver whose link is cut while its workers are elsewhere
# (a Ray driver needs a raylet on its own host): its workers ask for AWAY, a resource every
# other worker host has and it has not.
WORKER_HOSTS = (1, 2, 3, 4)
DRIVER_HOST = 4
AWAY = "away_from_driver_host"


@dataclass(frozen=True)
class Cluster:
    hosts: Hosts
    ray: RayHosts

    @classmethod
    @contextlib.contextmanager
    def started(cls) -> Iterator[Cluster]:
        """The shared layout above, started; everything removed after."""
        cpus = dict.fromkeys(WORKER_HOSTS, 1)
        away = {i: {AWAY: 1.0} for i in WORKER_HOSTS if i != DRIVER_HOST}
        with (
            Hosts(len(WORKER_HOSTS) + 1) as hosts,
            RayHosts(hosts, cpus=cpus, resources=away) as ray_hosts,
        ):
            yield cls(hosts, ray_hosts)
