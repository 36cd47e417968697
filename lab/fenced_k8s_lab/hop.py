"""A NAT hop in front of PostgreSQL that forgets idle flows, as a cloud NAT gateway or load
balancer does (AWS NLB after 350 s, GCP Cloud NAT after minutes): from then on it drops their
packets without a word, the client's keepalive probes included, while new flows pass.

The path: a client in this network namespace connects to ``<hop address>:5432``, the inner end of
a veth pair in a namespace of the hop's own. The hop's kernel rewrites the flow (nftables DNAT and
masquerade: real conntrack NAT, with ``nf_conntrack_tcp_loose`` off as a NAT gateway has it) back
to a relay on the outer end's address (``pgproxy.UserRoutingProxy``), which carries it to the
PostgreSQL server. ``forget()`` makes the hop forget the flows it carries now: their packets are
dropped in the hop's kernel, before anything could answer or reset them. A userspace proxy that
merely stops forwarding is no black hole: its kernel still acknowledges data and keepalives.

Needs root, ``ip`` (iproute2) and ``nft`` (nftables; ``.ci/setup`` installs it): ``skip_reason``
says why not. ``close()`` removes what the hop made: the relay, the namespace, the veth pair.
The addresses are a /30 of 198.18.0.0/15 (RFC 2544, for benchmarking: on no real network). Close
the hop only once nothing connects to its address any more: without the hop, the address is
routed like any other, by the default route.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import shutil
import socket
import subprocess
import time
import uuid

from fenced_k8s_lab.pgproxy import UserRoutingProxy

PORT = 5432
_RANGE = ipaddress.ip_network("198.18.0.0/15")
#: Seconds ``close`` waits for the kernel to destroy the namespace's veth pair (``ip netns delete``
#: returns before it does).
LINK_SETTLE = 10.0
_FLOW = re.compile(r"\bsrc=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)\b")


def skip_reason() -> str | None:
    """Why a hop cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "a NAT hop needs root (network namespaces, veth, nftables)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"a NAT hop needs `{tool}` (apt-get install {package}; .ci/setup installs it)"
    return None


def _run(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(list(args), input=stdin, check=True, capture_output=True, text=True, timeout=30).stdout


class NatHop:
    """``routes``: user name -> (host, port) of the PostgreSQL server that user's connections reach
    through the hop (the relay's routing)."""

    def __init__(self, routes: dict[str, tuple[str, int]]):
        self.routes = dict(routes)
        tag = uuid.uuid4().hex[:8]
        self.namespace = f"fkhop-{tag}"
        self._outer, self._inner = f"fkh{tag}o", f"fkh{tag}i"
        self._relay: UserRoutingProxy | None = None
        self.address = ""  # the hop's: clients connect to <address>:5432
        self._forgotten: set[int] = set()

    def url(self, user: str, database: str, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://{user}@{self.address}:{PORT}/{database}"

    def start(self) -> "NatHop":
        outer, inner = self._free_subnet()
        self.address = str(inner)
        try:
            _run("ip", "netns", "add", self.namespace)
            _run("ip", "link", "add", self._outer, "type", "veth", "peer", "name", self._inner, "netns", self.namespace)
            _run("ip", "addr", "add", f"{outer}/30", "dev", self._outer)
            _run("ip", "link", "set", self._outer, "up")
            _run("ip", "-n", self.namespace, "addr", "add", f"{inner}/30", "dev", self._inner)
            _run("ip", "-n", self.namespace, "link", "set", self._inner, "up")
            _run("ip", "-n", self.namespace, "link", "set", "lo", "up")
            self._in_namespace("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
                               f"net.ipv4.conf.{self._inner}.send_redirects=0",
                               "net.netfilter.nf_conntrack_tcp_loose=0")
            self._relay = UserRoutingProxy(self.routes, host=str(outer)).start()
            self._in_namespace("nft", "-f", "-", stdin=f"""
table ip hop {{
  set forgotten {{ type inet_service; }}
  chain prerouting {{ type nat hook prerouting priority dstnat; tcp dport {PORT} dnat to {outer}:{self._relay.port}; }}
  chain postrouting {{ type nat hook postrouting priority srcnat; masquerade; }}
  chain forward {{
    type filter hook forward priority filter;
    ct state invalid drop;
    meta l4proto tcp ct original proto-src @forgotten drop;
  }}
}}
""")
        except BaseException:
            self.close()
            raise
        return self

    def flows(self) -> set[int]:
        """The client ports of the flows the hop carries (its conntrack table: the original
        direction, towards the hop's port)."""
        ports = set()
        for line in self._in_namespace("cat", "/proc/net/nf_conntrack").splitlines():
            match = _FLOW.search(line)
            if " tcp " in line and match and match.group(2) == self.address and int(match.group(4)) == PORT:
                ports.add(int(match.group(3)))
        return ports

    def forget(self) -> set[int]:
        """Forget every flow the hop carries now (their packets are dropped from here on, in both
        directions); returns their client ports. New flows pass."""
        ports = self.flows() - self._forgotten
        if ports:
            self._in_namespace("nft", "add", "element", "ip", "hop", "forgotten",
                               "{ " + ", ".join(str(p) for p in sorted(ports)) + " }")
            self._forgotten |= ports
        return ports

    def sever(self) -> int:
        """Shut down this process's sockets connected to the hop: a thread blocked on a forgotten
        flow (a test's watchdog gave up on it) gets an error at once instead of after the kernel's
        retransmissions, about 15 minutes. Returns how many."""
        inodes = set()
        with open("/proc/net/tcp") as table:
            next(table)
            for line in table:
                fields = line.split()
                host, _, port = fields[2].partition(":")
                address = socket.inet_ntoa(bytes.fromhex(host)[::-1])
                if address == self.address and int(port, 16) == PORT:
                    inodes.add(fields[9])
        severed = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                with socket.socket(fileno=os.dup(int(fd))) as sock:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                        severed += 1
                    except OSError:
                        pass
        return severed

    def close(self) -> None:
        """Stop the relay, delete the namespace (and with it the veth pair), and wait until the
        kernel has removed the pair."""
        if self._relay is not None:
            self._relay.stop()
            self._relay = None
        subprocess.run(["ip", "netns", "delete", self.namespace], capture_output=True, timeout=30)
        deadline = time.monotonic() + LINK_SETTLE
        while self._link_exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._link_exists():
            subprocess.run(["ip", "link", "delete", self._outer], capture_output=True, timeout=30)

    def __enter__(self) -> "NatHop":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _in_namespace(self, *args: str, stdin: str | None = None) -> str:
        return _run("ip", "netns", "exec", self.namespace, *args, stdin=stdin)

    def _link_exists(self) -> bool:
        return subprocess.run(["ip", "link", "show", self._outer], capture_output=True, timeout=30).returncode == 0

    @staticmethod
    def _free_subnet() -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
        """A /30 of the range no interface of this namespace uses: (outer address, hop address)."""
        used = _run("ip", "-4", "-o", "addr", "show")
        for _ in range(100):
            start = int(_RANGE.network_address) + 4 * random.randrange(_RANGE.num_addresses // 4)
            subnet = ipaddress.ip_network((start, 30))
            outer, inner = list(subnet.hosts())
            if f"{outer}/" not in used and f"{inner}/" not in used:
                return outer, inner
        raise RuntimeError(f"no free /30 in {_RANGE}")
