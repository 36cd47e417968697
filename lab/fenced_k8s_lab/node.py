"""``../shared/node``: a real single-node Kubernetes 1.36.2 (kubelet, containerd, runc, CNI,
kube-proxy, DNS) started from local parts, for tests and the lab.

``Node.start()`` brings one up in a private work dir and ``stop()`` takes it down again
(``down.sh``: processes by PID, mounts, iptables rules, the bridge) and removes that dir, then
checks that the machine is as it was: no process or mount of that dir left, and the same network
links, network namespaces and Kubernetes or fenced-node iptables rules as before the start
(``LeftoversError`` otherwise). A cluster that is already up (one per machine: fixed bridge, ports)
is reused and left running; its kubeconfig comes from ``FENCED_NODE_KUBECONFIG``, the node's
default work dir, or the work dir its kube-apiserver's command line names.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fenced_k8s_lab.chart import SHARED

NODE = SHARED / "node"
BRIDGE = "fncbr0"  # made by up.sh, removed by down.sh (../shared/node/env.sh)
DEFAULT_WORK = Path("/var/lib/fenced-node")
#: Seconds the teardown check waits for pods' veth links to go: ``ip netns delete`` returns at once
#: and the kernel destroys the namespace's links afterwards (seen lingering past the check on 2 cores).
LINKS_SETTLE = 30.0


def skip_reason() -> str | None:
    """Why no real node can run here, or None."""
    if not (NODE / "up.sh").is_file():
        return f"no real node assets beside the repository ({NODE})"
    if os.geteuid() != 0:
        return "the real node needs root (kubelet, containerd, iptables)"
    if not Path("/etc/debian_version").is_file():
        return "the real node's install.sh supports Debian only"
    return None


class LeftoversError(RuntimeError):
    pass


def _host_state() -> dict[str, set[str]]:
    """What a node leaves behind when its teardown misses something."""
    def lines(*cmd: str) -> set[str]:
        try:
            return set(subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.splitlines())
        except (OSError, subprocess.SubprocessError):
            return set()

    rules = {line for line in lines("iptables-save") if "KUBE-" in line or "fenced-node" in line}
    links = {line.split(":")[1].strip().split("@")[0] for line in lines("ip", "-o", "link", "show") if ":" in line}
    netns = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    return {"iptables rules": rules, "network links": links, "network namespaces": netns}


def _processes():
    """(pid, argv) of every process still readable in /proc."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            yield int(pid), Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue


def _running_kubeconfig() -> Path | None:
    """The admin kubeconfig of the node that is up, found through its kube-apiserver's command line
    (``--client-ca-file WORK/pki/ca.crt``): a node started in a private work dir by a process that
    is gone (a killed test run, a lab left up) is still reusable."""
    for _, args in _processes():
        if not args[0].endswith("kube-apiserver") or "--client-ca-file" not in args[:-1]:
            continue
        kubeconfig = Path(args[args.index("--client-ca-file") + 1]).parents[1] / "admin.kubeconfig"
        if kubeconfig.is_file():
            return kubeconfig
    return None


def _node_up() -> bool:
    """A node's bridge exists: one is up (a TCP probe of its address proves nothing while the
    bridge is down, since the address is then routed off the machine)."""
    return Path("/sys/class/net", BRIDGE).exists()


@dataclass
class Node:
    kubeconfig: str = ""
    bin_dir: str = ""  # what install.sh printed: kubectl and the cluster's binaries
    owned: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    _work: Path | None = None
    _run: Path | None = None
    _before: dict[str, set[str]] = field(default_factory=dict)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self._work is not None:
            env.update(FENCED_WORK=str(self._work), FENCED_RUN=str(self._run))
        return env

    def _sh(self, script: str, *args: str, timeout: float = 600) -> str:
        out = subprocess.run(["bash", str(NODE / script), *args], capture_output=True, text=True,
                             env=self._env(), timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{script} failed ({out.returncode}): {out.stderr.strip()[-3000:]}")
        return out.stdout.strip()

    def start(self) -> "Node":
        t0 = time.monotonic()
        self.bin_dir = self._sh("install.sh").splitlines()[-1]
        self.timings["install"] = round(time.monotonic() - t0, 1)
        given = os.environ.get("FENCED_NODE_KUBECONFIG")
        if given or _node_up():
            found = DEFAULT_WORK / "admin.kubeconfig"
            self.kubeconfig = given or str(found if found.is_file() else _running_kubeconfig() or found)
            if not Path(self.kubeconfig).is_file():
                raise RuntimeError(f"a node is up (bridge {BRIDGE}) but {self.kubeconfig} does not exist and no "
                                   "running kube-apiserver names its own: set FENCED_NODE_KUBECONFIG, or take "
                                   "the node down with ../shared/node/down.sh (FENCED_WORK, FENCED_RUN)")
            self.timings["up"] = 0.0
            return self
        self._before = _host_state()
        self._work = Path(tempfile.mkdtemp(prefix="fenced-node-"))
        self._run = Path(tempfile.mkdtemp(prefix="fenced-node-run-", dir="/run" if os.access("/run", os.W_OK) else None))
        self.owned = True
        t1 = time.monotonic()
        try:
            self.kubeconfig = self._sh("up.sh").splitlines()[-1]
        except BaseException:
            self.stop()
            raise
        self.timings["up"] = round(time.monotonic() - t1, 1)
        return self

    @property
    def kubectl(self) -> str:
        return str(Path(self.bin_dir) / "kubectl")

    def load(self, image_tar: str | os.PathLike) -> str:
        t0 = time.monotonic()
        out = self._sh("load-image.sh", str(image_tar))
        self.timings[f"load {Path(image_tar).name}"] = round(time.monotonic() - t0, 1)
        return out

    def stop(self) -> None:
        """down.sh and the private work dirs, only for a node this object started."""
        if not self.owned:
            return
        t0 = time.monotonic()
        try:
            self._sh("down.sh")
        finally:
            left = self._leftovers()
            for path in (self._work, self._run):
                if path is not None:
                    shutil.rmtree(path, ignore_errors=True)
            self.owned = False
            self.timings["down"] = round(time.monotonic() - t0, 1)
        if left:
            raise LeftoversError("the node's teardown left the machine changed: " + "; ".join(left))

    def _leftovers(self) -> list[str]:
        dirs = [str(d) for d in (self._work, self._run) if d is not None]
        left = []
        procs = []
        for pid, args in _processes():
            cmd = " ".join(args)
            if pid != os.getpid() and any(d in cmd for d in dirs):
                procs.append(f"{pid} {cmd[:80]}")
        if procs:
            left.append(f"processes {procs}")
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if any(line.split()[1].startswith(d) for d in dirs)]
        if mounts:
            left.append(f"mounts {mounts}")
        added = self._added()
        deadline = time.monotonic() + LINKS_SETTLE
        while added.get("network links") and time.monotonic() < deadline:
            time.sleep(0.5)  # a deleted pod netns frees its veth peers later, from a kernel work queue
            added = self._added()
        left += [f"{what} {items[:10]}" for what, items in added.items() if items]
        return left

    def _added(self) -> dict[str, list[str]]:
        after = _host_state()
        return {what: sorted(after.get(what, set()) - before) for what, before in self._before.items()}
