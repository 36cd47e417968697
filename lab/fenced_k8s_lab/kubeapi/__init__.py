"""A Kubernetes API emulator (core/v1 pods and namespaces, coordination.k8s.io/v1 leases) over real HTTP.

Why: the fences must be proven across processes (schedulers, kubelet, workers) against the
API semantics they rely on -- uids, resourceVersions, selectors, preconditions, graceful
deletion, watch resume and 410s -- which mocks inside one process cannot show.
See docs/lab.md ("Emulator") for what is and is not modelled.

In-process API (stable; used by tests, the process kubelet and the lab)::

    from fenced_k8s_lab.kubeapi import Emulator, EmulatorControl

    emu = Emulator(tokens={"tok-a": "scheduler-a"}, history_size=1000, bookmark_interval=60.0)
    url = emu.start()                      # "http://127.0.0.1:<port>", served from a thread
    emu.write_kubeconfig(path, token="tok-a", namespace="default")
    emu.append_log(ns, pod, "text\\n")      # what pods/log serves (container=None: whole pod)
    emu.set_log_file(ns, pod, "/path/out.log")   # or serve a file, re-read on every request
    emu.add_fault(method="POST", path=r"/pods$", status=503, times=1, after=0, who=None)
    emu.add_fault(method="POST", path=r"/pods$", persist_then_timeout=True, hang_seconds=None)
    emu.add_fault(method="GET", path=r"/pods$", delay=2.0)   # or drop=True
    emu.clear_faults(); emu.faults()
    emu.audit(since=0)                     # [{index, ts, who, verb, path, query, namespace, name,
                                           #   resource, subresource, code, object?, fault?}]
    emu.compact(); emu.close_watches(); emu.bookmark(); emu.reset(); emu.summary()
    emu.set_tokens({"tok-b": "scheduler-b"})
    emu.ensure_namespace("airflow")         # emu.name == "emulator", emu.supports_faults == True
    emu.pods(ns) / emu.pod(ns, name)       # deep copies of stored objects
    emu.leases(ns) / emu.lease(ns, name)   # (faults on lease paths: path=r"/leases(/|$)")
    emu.stop()

The same subset (name, url, write_kubeconfig, set_tokens, ensure_namespace, audit, reset, pods)
is offered by a real kube-apiserver, `lab.controlplane.ControlPlane` (name "real"): tests take
either through the `kube_backend` fixture (tests/conftest.py). Where the two disagree, the real
apiserver is right and the emulator is fixed (see docs/lab.md, "Real kube-apiserver").

`EmulatorControl(url)` has the same control methods over HTTP for an emulator started as a
subprocess: `python -m fenced_k8s_lab.kubeapi --host 127.0.0.1 --port N
[--tokens JSON] [--kubeconfig PATH --token T]` (prints `READY <url>`; loopback only).

HTTP controls (under /_emulator/): POST compact | close-watches | bookmark | reset | tokens;
POST/GET/DELETE faults (DELETE faults/{id}); GET/DELETE audit (?since=N); GET state;
POST (append) / PUT (replace) / GET / DELETE logs/{ns}/{pod}[?container=c] with the raw text
as body; POST logfiles/{ns}/{pod} with {"path": ..., "container": ...}.
"""

from .controls import Fault, State
from .emulator import Emulator, EmulatorControl, check_loopback
from .server import make_app

__all__ = ["Emulator", "EmulatorControl", "Fault", "State", "make_app", "check_loopback"]
