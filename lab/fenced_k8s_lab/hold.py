"""Hold new pods Pending on any cluster: a NoSchedule taint on the nodes, lifted later.

    python -m fenced_k8s_lab.hold hold|release|status     # KUBECONFIG, else ~/.kube/config

Which nodes: those labelled ``fenced-k8s-executor.io/lab-node`` (kind-config/cluster.yaml labels
its two workers), or every node when none is labelled (the single node of ../shared/node).
NoSchedule never evicts a running pod. The Airflow components and the metadata database tolerate
the taint (kind-config/node/values.yaml, kind-config/postgres.yaml), the worker pods do not: while
the hold is on, worker pods are created and stay Pending (Unschedulable); a component pod
recreated meanwhile (failover, rolling restart) still schedules. Used by tests/kind and by
kind-config/pending-pressure/taint.sh.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Iterator

from fenced_k8s_lab.chart import Cluster

TAINT_KEY = "fenced-k8s-executor.io/hold"
LAB_NODE_LABEL = "fenced-k8s-executor.io/lab-node"
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def held_nodes(cluster: Cluster) -> list[str]:
    """The names of the nodes the hold applies to: the labelled ones, else all."""
    names = "jsonpath={.items[*].metadata.name}"
    labelled = cluster.run("get", "nodes", "-l", LAB_NODE_LABEL, "-o", names).split()
    return labelled or cluster.run("get", "nodes", "-o", names).split()


def hold(cluster: Cluster) -> list[str]:
    nodes = held_nodes(cluster)
    for node in nodes:
        cluster.run("taint", "nodes", node, "--overwrite", f"{TAINT_KEY}=true:NoSchedule")
    return nodes


def release(cluster: Cluster) -> list[str]:
    nodes = held_nodes(cluster)
    for node in nodes:
        if status(cluster).get(node):
            cluster.run("taint", "nodes", node, f"{TAINT_KEY}:NoSchedule-")
    return nodes


def status(cluster: Cluster) -> dict[str, bool]:
    """Node name -> whether the hold taint is on it, for the nodes the hold applies to."""
    nodes = json.loads(cluster.run("get", "nodes", "-o", "json"))["items"]
    found = {n["metadata"]["name"]: any(t.get("key") == TAINT_KEY for t in n["spec"].get("taints") or [])
             for n in nodes}
    return {name: found.get(name, False) for name in held_nodes(cluster)}


@contextlib.contextmanager
def held(cluster: Cluster) -> Iterator[list[str]]:
    """The hold for the duration of a ``with`` block; released however the block ends."""
    nodes = hold(cluster)
    try:
        yield nodes
    finally:
        release(cluster)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("hold", "release", "status"):
        print("usage: python -m fenced_k8s_lab.hold hold|release|status", file=sys.stderr)
        return 2
    cluster = Cluster(os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config"))
    if args[0] == "status":
        for node, on in status(cluster).items():
            print(f"{node} {'held' if on else 'free'}")
    else:
        for node in (hold if args[0] == "hold" else release)(cluster):
            print(f"{node} {args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
