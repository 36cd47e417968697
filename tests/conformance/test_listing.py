"""Listing: label selectors (every operator), field selectors, paging, metadata-only lists."""

from __future__ import annotations

import json

import pytest
from kubernetes.dynamic import DynamicClient

PODS = {
    "sel-a": {"tier": "web", "env": "prod"},
    "sel-b": {"tier": "web", "env": "dev"},
    "sel-c": {"tier": "db"},
    "sel-d": {"other": "x"},
}


@pytest.fixture(scope="module")
def selector_ns(v1, module_ns, h):
    for name, labels in PODS.items():
        h.create_pod(v1, module_ns, h.pod_body(name=name, labels={"suite": "sel", **labels}))
    return module_ns


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("tier=web", {"sel-a", "sel-b"}),
        ("tier==db", {"sel-c"}),
        ("tier!=web", {"sel-c", "sel-d"}),
        ("env in (prod,staging)", {"sel-a"}),
        ("tier notin (web)", {"sel-c", "sel-d"}),
        ("env", {"sel-a", "sel-b"}),
        ("!env", {"sel-c", "sel-d"}),
        ("tier=web,env!=prod", {"sel-b"}),
        ("suite=sel,!tier,other in (x)", {"sel-d"}),
        ("tier in ()", set()),  # an empty set is valid: matches nothing (kube-apiserver 1.36)
        ("suite=sel,tier notin ()", {"sel-a", "sel-b", "sel-c", "sel-d"}),
    ],
)
def test_label_selectors(v1, selector_ns, selector, expected):
    pods = v1.list_namespaced_pod(selector_ns, label_selector=selector).items
    assert {p.metadata.name for p in pods} == expected


@pytest.mark.parametrize("selector", ["tier in (web", "tier=web,", "=web", "bad key!=x"])
def test_malformed_label_selector_is_400(v1, selector_ns, selector, h):
    with pytest.raises(h.ApiException) as err:
        v1.list_namespaced_pod(selector_ns, label_selector=selector)
    assert err.value.status == 400


def test_field_selectors_name_namespace_node(v1, ns, make_pod, h):
    bound = make_pod(name="fs-bound", node=h.FAKE_NODE)
    make_pod(name="fs-free")
    names = lambda **kw: {p.metadata.name for p in v1.list_namespaced_pod(ns, **kw).items}  # noqa: E731
    assert names(field_selector="metadata.name=fs-free") == {"fs-free"}
    assert names(field_selector="metadata.name!=fs-free") == {"fs-bound"}
    assert names(field_selector=f"spec.nodeName={h.FAKE_NODE}") == {"fs-bound"}
    assert names(field_selector="spec.nodeName=") == {"fs-free"}
    everywhere = v1.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={ns},metadata.name==fs-bound")
    assert [p.metadata.uid for p in everywhere.items] == [bound.metadata.uid]


def test_field_selector_status_phase(v1, ns, make_pod):
    make_pod(name="ph-pending")
    make_pod(name="ph-done")
    v1.patch_namespaced_pod_status("ph-done", ns, {"status": {"phase": "Succeeded"}})
    got = lambda sel: {p.metadata.name for p in v1.list_namespaced_pod(ns, field_selector=sel).items}  # noqa: E731
    assert got("status.phase!=Succeeded") == {"ph-pending"}
    assert got("status.phase=Succeeded") == {"ph-done"}
    assert got("status.phase!=Succeeded,status.phase!=Failed") == {"ph-pending"}


@pytest.mark.parametrize("selector", ["spec.containers=x", "metadata.labels=x", "bogus"])
def test_unsupported_field_selector_is_400(v1, ns, selector, h):
    with pytest.raises(h.ApiException) as err:
        v1.list_namespaced_pod(ns, field_selector=selector)
    assert err.value.status == 400
    assert h.status_of(err.value)["reason"] == "BadRequest"


def test_limit_and_continue(v1, ns, make_pod):
    created = {make_pod(name=f"page-{i}", labels={"paged": "yes"}).metadata.name for i in range(5)}
    seen, tokens, rvs = [], [], set()
    kwargs = {"limit": 2, "label_selector": "paged=yes"}
    while True:
        page = v1.list_namespaced_pod(ns, **kwargs)
        assert len(page.items) <= 2
        seen += [p.metadata.name for p in page.items]
        rvs.add(page.metadata.resource_version)
        if not page.metadata._continue:
            break
        tokens.append(page.metadata._continue)
        kwargs["_continue"] = page.metadata._continue
    assert sorted(seen) == sorted(created) and len(seen) == 5
    assert len(tokens) == 2
    assert len(rvs) == 1  # every page is served at the first page's resourceVersion


def test_bad_continue_token_is_400_or_410(v1, ns, h):
    with pytest.raises(h.ApiException) as err:
        v1.list_namespaced_pod(ns, limit=1, _continue="not-a-token")
    assert err.value.status in (400, 410)


def test_list_has_resource_version(v1, ns, make_pod):
    make_pod()
    listing = v1.list_namespaced_pod(ns)
    assert listing.metadata.resource_version
    assert listing.kind == "PodList" and listing.api_version == "v1"


def test_metadata_only_list_via_dynamic_client(api_client, ns, make_pod, h):
    """Exactly how the provider's KubernetesExecutor._list_pods calls it."""
    pod = make_pod(labels={"airflow-worker": "1"}, annotations={"a": "b"})
    dynamic = DynamicClient(api_client)
    resource = dynamic.resources.get(api_version="v1", kind="Pod")
    result = dynamic.get(resource=resource, namespace=ns, label_selector="airflow-worker=1",
                         header_params={"Accept": h.PARTIAL_LIST})
    assert result.kind == "PartialObjectMetadataList" and result.apiVersion == "meta.k8s.io/v1"
    assert [i.metadata.name for i in result.items] == [pod.metadata.name]
    item = result.items[0].to_dict()
    assert "spec" not in item and "status" not in item
    assert item["metadata"]["annotations"]["a"] == "b" and item["metadata"]["uid"] == pod.metadata.uid


def test_metadata_only_get(api_client, ns, make_pod, h):
    pod = make_pod()
    resp = h.raw(api_client, "GET", f"/api/v1/namespaces/{ns}/pods/{pod.metadata.name}",
                 headers={"Accept": h.PARTIAL})
    body = json.loads(resp.data)
    assert body["kind"] == "PartialObjectMetadata" and body["apiVersion"] == "meta.k8s.io/v1"
    assert body["metadata"]["uid"] == pod.metadata.uid and "spec" not in body
