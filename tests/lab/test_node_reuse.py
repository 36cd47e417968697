"""A real node left up in a private work dir by a process that is gone (a killed test run, a lab
left up) is found through its kube-apiserver's command line and reused, not mistaken for none."""

from __future__ import annotations

import subprocess
import sys
import time

from fenced_k8s_lab import node as node_mod


def test_a_node_left_up_in_a_private_work_dir_is_found_by_its_apiserver(tmp_path):
    work = tmp_path / "fenced-node-left"
    (work / "pki").mkdir(parents=True)
    (work / "admin.kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    assert node_mod._running_kubeconfig() != work / "admin.kubeconfig"
    stand_in = subprocess.Popen(  # argv[0] and the flag as up.sh starts the apiserver
        ["bash", "-c", f'exec -a "{tmp_path}/bin/kube-apiserver" "{sys.executable}" -c "import time; '
                       f'time.sleep(60)" --client-ca-file "{work}/pki/ca.crt"'])
    try:
        deadline = time.monotonic() + 10
        while node_mod._running_kubeconfig() != work / "admin.kubeconfig" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node_mod._running_kubeconfig() == work / "admin.kubeconfig"
    finally:
        stand_in.kill()
        stand_in.wait()
