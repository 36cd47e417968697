"""Emulator-only test controls: audit log, fault injection, tokens, subprocess mode.

All skipped against a real cluster (they take the `emu` fixture)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import urllib3

from fenced_k8s_lab.kubeapi import Emulator, EmulatorControl


def test_audit_records_caller_verb_and_created_metadata(v1, ns, make_pod, emu):
    start = len(emu.audit())
    pod = make_pod(generate_name="audited-", labels={"l": "1"}, annotations={"a": "2"})
    v1.read_namespaced_pod(pod.metadata.name, ns)
    v1.list_namespaced_pod(ns, label_selector="l=1")
    v1.delete_namespaced_pod(pod.metadata.name, ns)
    entries = [e for e in emu.audit(since=start) if e["namespace"] == ns]
    assert [e["verb"] for e in entries] == ["create", "get", "list", "delete"]
    assert {e["who"] for e in entries} == {"conformance"}
    assert [e["code"] for e in entries] == [201, 200, 200, 200]
    created = entries[0]
    assert created["code"] == 201 and created["name"] == pod.metadata.name
    assert created["object"] == {"name": pod.metadata.name, "labels": {"l": "1"}, "annotations": {"a": "2"}}


def test_unknown_token_is_recorded_by_prefix(emu, h):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = emu.url
    cfg.api_key = {"authorization": "Bearer abcdefghijklmnop-secret"}
    api = client.CoreV1Api(client.ApiClient(cfg))
    start = len(emu.audit())
    api.list_namespaced_pod("default")
    assert emu.audit(since=start)[-1]["who"] == "token:abcdefgh"


def test_status_fault_times_and_after(v1, ns, emu, h):
    fid = emu.add_fault(method="POST", path=rf"/namespaces/{ns}/pods$", status=503, times=1, after=1)
    try:
        h.create_pod(v1, ns, h.pod_body(name="f-1"))  # skipped by after=1
        with pytest.raises(h.ApiException) as err:
            h.create_pod(v1, ns, h.pod_body(name="f-2"))
        assert err.value.status == 503
        h.create_pod(v1, ns, h.pod_body(name="f-3"))  # times=1 exhausted
        assert [f["fired"] for f in emu.faults() if f["id"] == fid] == [1]
    finally:
        emu.clear_faults(fid)


def test_delay_fault(v1, ns, emu):
    emu.add_fault(method="GET", path=rf"/namespaces/{ns}/pods$", delay=0.5, times=1)
    started = time.monotonic()
    v1.list_namespaced_pod(ns)
    assert time.monotonic() - started >= 0.5


def test_persist_then_timeout_stores_pod_but_client_times_out(v1, ns, emu, h):
    emu.add_fault(method="POST", path=rf"/namespaces/{ns}/pods$", persist_then_timeout=True, times=1)
    with pytest.raises((urllib3.exceptions.HTTPError, OSError)):
        h.create_pod(v1, ns, h.pod_body(name="ghost"), _request_timeout=1)
    assert v1.read_namespaced_pod("ghost", ns).metadata.uid  # the create happened after all


def test_drop_fault_is_a_connection_error(v1, ns, emu, h):
    # urllib3 (under the kube client) retries a dropped connection up to 3 times by itself
    fid = emu.add_fault(method="GET", path=rf"/namespaces/{ns}/pods$", drop=True, times=1)
    v1.list_namespaced_pod(ns)
    assert [f["fired"] for f in emu.faults() if f["id"] == fid] == [1]
    fid = emu.add_fault(method="GET", path=rf"/namespaces/{ns}/pods$", drop=True)
    try:
        with pytest.raises((urllib3.exceptions.HTTPError, OSError)):
            v1.list_namespaced_pod(ns, _request_timeout=5)
    finally:
        emu.clear_faults(fid)
    v1.list_namespaced_pod(ns)


def test_fault_filtered_by_caller(v1, ns, emu):
    emu.add_fault(method="GET", path=rf"/namespaces/{ns}/pods$", status=500, who="somebody-else")
    try:
        v1.list_namespaced_pod(ns)  # not us
    finally:
        emu.clear_faults()


def test_reset_clears_everything(emu):
    with Emulator() as emu:  # a private instance: reset must not disturb other tests
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = emu.url
        api = client.CoreV1Api(client.ApiClient(cfg))
        api.create_namespaced_pod("default", {"metadata": {"name": "x"},
                                              "spec": {"containers": [{"name": "c", "image": "i:1"}]}})
        emu.add_fault(method="DELETE", path=".*", status=500)
        emu.reset()
        assert api.list_namespaced_pod("default").items == []
        assert emu.faults() == [] and emu.summary()["pods"] == 0
        assert emu.pods() == []


def test_subprocess_mode_and_http_controls(emu, tmp_path):
    kc = tmp_path / "kc"
    proc = subprocess.Popen([sys.executable, "-m", "fenced_k8s_lab.kubeapi", "--port", "0",
                             "--tokens", '{"t1": "sched-1"}', "--kubeconfig", str(kc), "--token", "t1"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("READY http://127.0.0.1:")
        ctl = EmulatorControl(line.split()[1])
        from kubernetes import client, config

        api = client.CoreV1Api(config.new_client_from_config(str(kc)))
        api.create_namespaced_pod("ns1", {"metadata": {"name": "p"},
                                          "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i:1"}]}})
        ctl.append_log("ns1", "p", "hello\n")
        assert api.read_namespaced_pod_log("p", "ns1", _preload_content=False).data == b"hello\n"
        assert ctl.audit()[-1]["who"] == "sched-1"
        fid = ctl.add_fault(method="GET", path="/pods/p$", status=500, times=1)
        assert ctl.faults()[0]["id"] == fid
        ctl.compact()
        assert ctl.summary()["history"] == 0
        ctl.reset()
        assert ctl.summary()["pods"] == 0
    finally:
        proc.terminate()
        proc.wait(15)


def test_refuses_non_loopback_host(emu):
    with pytest.raises(ValueError):
        Emulator(host="0.0.0.0")
    result = subprocess.run([sys.executable, "-m", "fenced_k8s_lab.kubeapi", "--host", "0.0.0.0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "non-loopback" in result.stderr
