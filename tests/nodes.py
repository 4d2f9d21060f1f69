"""Several machines on one: "nodes" for tests, each a network namespace with its own address on a
bridge, its own host name, its own /tmp and /dev/shm, and its own /etc/hosts naming every node (as
a cluster's DNS would). A directory under /tmp is shared between nodes only where a test says a
shared file system exists; what a test seeds, each node gets its own copy of, at the same path.
`node.own(path)` is where the host sees a node's own file.

    with Nodes(2, tmp_path, shared=[tmp_path / "shared"], keep=[checkout]) as (a, b):
        a.run([...])                 # in node a: host name node-a, address 10.77.0.1
        b.popen([...])
        b.cut()                      # node b's link down: its peers no longer reach it

Nothing leaves the namespaces: the bridge lives in a namespace of its own (the "switch"), no node
has a route beyond 10.77.0.0/24, and the host's own interfaces and routes are not touched. Every
namespace, and every process left in one, is removed on exit. Needs root, `ip` and `unshare`
(util-linux); `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

SUBNET = "10.77.0"          # node i is SUBNET.(i + 1); the switch has no address at all

# Run by `unshare --mount --uts --propagation private` inside the node's network namespace: the
# host name, the node's /etc/hosts, and the node's own /tmp and /dev/shm (directories of the test
# on the host, so that they outlive each command and a test can look into them), into whose /tmp
# the paths to keep are bound back, shared with the host. The host's /tmp is visible only through a
# staging mount, removed before the command starts.
SETUP = r"""
set -eu
hostname "$NODE_NAME"
mount --bind "$NODE_HOSTS" /etc/hosts
mount --bind "$NODE_SHM" /dev/shm
mount -t tmpfs node-stage /mnt
mkdir /mnt/host-tmp && mount --bind /tmp /mnt/host-tmp
mount --bind "/mnt/host-tmp/${NODE_TMP#/tmp/}" /tmp
for p in $NODE_KEEP; do
    case "$p" in /tmp/*) mkdir -p "$p" && mount --bind "/mnt/host-tmp/${p#/tmp/}" "$p";; esac
done
umount -l /mnt/host-tmp && umount -l /mnt
cd "$NODE_CWD"
exec "$@"
"""

def unavailable() -> str | None:
    """Why nodes cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "hostname", "mount"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    probe = f"grpo-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    done = subprocess.run(["unshare", "--mount", "--uts", "--propagation", "private", "true"],
                          capture_output=True, text=True)
    if done.returncode:
        return f"unshare --mount --uts fails here: {done.stderr.strip()}"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Node:
    def __init__(self, nodes: "Nodes", index: int):
        self.nodes, self.index = nodes, index
        self.name = f"node-{chr(ord('a') + index)}"
        self.netns = f"grpo-{nodes.tag}-{chr(ord('a') + index)}"
        self.address = f"{SUBNET}.{index + 1}"
        self.port_name = f"p{nodes.tag}{index}"          # its end on the switch (15 characters at most)
        self.processes: list[subprocess.Popen] = []
        self.tmp = nodes.workdir / f"{self.name}-tmp"          # the node's /tmp, as the host sees it
        self.shm = nodes.workdir / f"{self.name}-shm"          # its /dev/shm

    def own(self, path: Path | str) -> Path:
        """Where the host sees this node's `path` (one under /tmp or /dev/shm)."""
        path = Path(path)
        for root, mine in ((Path("/tmp"), self.tmp), (Path("/dev/shm"), self.shm)):
            if path.is_relative_to(root):
                return mine / path.relative_to(root)
        raise ValueError(f"{path} is not a node's own: only /tmp and /dev/shm are")

    def command(self, argv: list[str], cwd: Path | str | None = None) -> list[str]:
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--propagation",
                "private", "sh", "-c", SETUP, self.name, *map(str, argv)]

    def env(self, env: dict | None, cwd) -> dict:
        nodes = self.nodes
        return {**(env if env is not None else os.environ), "NODE_NAME": self.name,
                "NODE_HOSTS": str(nodes.hosts), "NODE_CWD": str(cwd or nodes.cwd),
                "NODE_KEEP": " ".join(map(str, nodes.keep)), "NODE_TMP": str(self.tmp),
                "NODE_SHM": str(self.shm)}

    def popen(self, argv: list[str], *, env: dict | None = None, cwd=None, **kwargs) -> subprocess.Popen:
        """Start `argv` in this node (its own session, killed with the nodes)."""
        process = subprocess.Popen(self.command(argv), env=self.env(env, cwd), start_new_session=True,
                                   **kwargs)
        self.processes.append(process)
        return process

    def run(self, argv: list[str], *, env: dict | None = None, cwd=None, timeout: float = 300,
            **kwargs) -> subprocess.CompletedProcess:
        """Run `argv` in this node to its end (killed, with what it printed, at `timeout`)."""
        process = self.popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, **kwargs)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            out, err = process.communicate()
            raise AssertionError(f"{self.name}: {argv} ran past {timeout} s\n{err[-3000:]}") from None
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def cut(self) -> None:
        """This node's link down, at the switch: no packet reaches it or leaves it."""
        _ip("-n", self.nodes.switch, "link", "set", self.port_name, "down")

    def mend(self) -> None:
        _ip("-n", self.nodes.switch, "link", "set", self.port_name, "up")

    def pids(self) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Nodes:
    def __init__(self, n: int, workdir: Path, *, shared: list[Path] = (), keep: list[Path] = (),
                 seed: list[Path] = (), cwd: Path | None = None):
        """`n` nodes. `shared` and `keep`: directories every node sees as the host does (a shared
        file system; the checkout and its environments). `seed`: files or directories each node
        gets its own copy of, at the same path. Paths outside /tmp are seen as the host sees them
        (this machine's /work, /usr, /root: the software a cluster's nodes would each have)."""
        self.n, self.workdir = n, Path(workdir)
        self.tag = secrets.token_hex(3)
        self.switch = f"grpo-{self.tag}-sw"
        self.keep = [Path(p).resolve() for p in (*shared, *keep)]
        self.seed = [Path(p).resolve() for p in seed]
        if not self.workdir.resolve().is_relative_to("/tmp"):
            raise ValueError(f"{workdir}: the nodes' directories must be under /tmp")
        self.cwd = cwd or "/"
        self.hosts = self.workdir / f"hosts-{self.tag}"
        self.nodes = [Node(self, i) for i in range(n)]

    def __enter__(self) -> list[Node]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for p in self.keep:
            p.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            node.tmp.mkdir(exist_ok=True)
            node.shm.mkdir(exist_ok=True)
            for p in self.seed:                 # each node's own copy, at the same path
                copy = node.own(p)
                copy.parent.mkdir(parents=True, exist_ok=True)
                if p.is_dir():                  # a node made again on the same workdir keeps its disk
                    shutil.copytree(p, copy, dirs_exist_ok=True)
                else:
                    shutil.copy2(p, copy)
        self.hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{node.address} {node.name}\n"
                                                                for node in self.nodes))
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for node in self.nodes:
                _ip("netns", "add", node.netns)
                _ip("-n", self.switch, "link", "add", node.port_name, "type", "veth", "peer", "name",
                    "eth0", "netns", node.netns)
                _ip("-n", self.switch, "link", "set", node.port_name, "master", "br0", "up")
                _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
                _ip("-n", node.netns, "link", "set", "eth0", "up")
                _ip("-n", node.netns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self.nodes

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kill what runs in the nodes, then remove every namespace (and with them the links)."""
        for node in self.nodes:
            for process in node.processes:
                _kill_group(process)
            for pid in node.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while any(node.pids() for node in self.nodes) and time.monotonic() < deadline:
            time.sleep(0.1)
        for node in self.nodes:
            for process in node.processes:
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for name in [node.netns for node in self.nodes] + [self.switch]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.hosts.unlink(missing_ok=True)


def shell(line: str) -> list[str]:
    return ["sh", "-c", line]


__all__ = ["Nodes", "Node", "unavailable", "shell", "shlex"]
