"""`[core] hostname_callable` for the lab: the pod name, so `ti.hostname` names the pod.

The process kubelet sets HOSTNAME=<pod name> (as Kubernetes does); without this callable
every worker would report the one machine's FQDN and pods could not be told apart.
"""

from __future__ import annotations

import os
import socket


def pod_hostname() -> str:
    return os.environ.get("HOSTNAME") or socket.getfqdn()
