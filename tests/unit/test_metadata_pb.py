"""metadata_pb over generated messages: whatever the strings and their lengths (varints of one to
three bytes), the fields a fence reads come back exactly and every other field is skipped. The
real kube-apiserver is the judge of the field numbers (tests/integration/test_pods_calls.py);
this covers the byte-level reading."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from fenced_k8s_executor import metadata_pb


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _text(number: int, value: str) -> bytes:
    return _field(number, value.encode())


def _object_meta(meta: dict, noise: bytes) -> bytes:
    out = _text(1, meta["name"]) + _text(2, "generate-") + _text(3, meta["namespace"]) + _text(5, meta["uid"])
    out += _varint(7 << 3) + _varint(2**40)  # generation: a varint scalar
    if meta.get("deletionTimestamp"):
        out += _field(9, _varint(1 << 3) + _varint(1_764_547_200))
    for key, value in meta["annotations"].items():
        out += _field(12, _text(1, key) + _text(2, value))
    out += _field(11, _text(1, "label") + _text(2, "value"))
    return out + _field(17, noise)  # managedFields: skipped by length


texts = st.text(min_size=0, max_size=300)
metas = st.fixed_dictionaries({
    "name": st.text(min_size=1, max_size=63),
    "namespace": st.text(min_size=1, max_size=63),
    "uid": st.uuids().map(str),
    "annotations": st.dictionaries(texts, st.text(max_size=20_000), max_size=12),
    "deletionTimestamp": st.booleans(),
})


@given(items=st.lists(metas, max_size=6), token=st.one_of(st.none(), st.text(min_size=1, max_size=400)),
       noise=st.binary(max_size=3000), version=st.text(alphabet="0123456789", min_size=1, max_size=20))
def test_reads_every_item_the_continue_token_and_the_resource_version(items, token, noise, version):
    list_meta = _text(2, version) + (_text(3, token) if token else b"")
    body = _field(1, list_meta) + b"".join(_field(2, _field(1, _object_meta(m, noise))) for m in items)
    envelope = metadata_pb.MAGIC + _field(1, _text(1, "meta.k8s.io/v1") + _text(2, "PartialObjectMetadataList"))
    envelope += _field(2, body) + _text(4, "")

    decoded, continue_token = metadata_pb.decode_list(envelope)

    assert continue_token == token
    assert metadata_pb.continue_token(envelope) == token  # read alone, as the pager does
    assert metadata_pb.resource_version(envelope) == version  # where a watch of the pending pods starts
    expected = [{k: v for k, v in m.items() if k != "deletionTimestamp" or v} for m in items]
    assert decoded == expected


@given(body=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_value_error(body):
    try:
        metadata_pb.decode_list(metadata_pb.MAGIC + body)
    except ValueError:
        pass


@pytest.mark.parametrize("body", [b"", b"k8s\x00", b"k8s\x00\x12\x05ab", b"k8s\x00\x12\x02\x12\x7f", b"{}",
                                  b"k8s\x00\x12\x01\xff", b"k8s\x00\x13"])
def test_a_malformed_page_is_an_error_never_a_page(body):
    with pytest.raises(ValueError):
        metadata_pb.decode_list(body)
    if body.startswith(metadata_pb.MAGIC):
        with pytest.raises(ValueError):
            metadata_pb.continue_token(body)


@pytest.mark.parametrize("entry, expected", [
    (_text(1, "k") + _text(2, "v"), ("k", "v")),
    (_text(2, "v") + _text(1, "k"), ("k", "v")),                      # fields in any order
    (_text(1, "k"), ("k", "")),                                      # an empty value is not sent
    (_text(2, "v"), ("", "v")),
    (_text(1, "k") + _text(2, "old") + _text(2, "v"), ("k", "v")),   # a repeated field: the last wins
    (_varint(3 << 3) + _varint(300) + _text(1, "k") + _field(20, b"x") + _text(2, "v"), ("k", "v")),  # unknown fields
    (b"\x8a\x00" + _varint(1) + b"k" + _text(2, "v"), ("k", "v")),  # a tag in a padded (two-byte) varint
])
def test_an_annotation_entry_reads_as_protobuf_says(entry, expected):
    item = _text(1, "p") + _field(12, entry)
    envelope = metadata_pb.MAGIC + _field(2, _field(2, _field(1, item)))

    (meta,), _ = metadata_pb.decode_list(envelope)

    assert meta["annotations"] == dict([expected])


@pytest.mark.parametrize("entry", [_text(1, "k")[:-1], b"\x0a", b"\x12\x85", _varint(3 << 3 | 3)])
def test_a_malformed_annotation_entry_is_an_error(entry):
    item = _text(1, "p") + _field(12, entry)
    with pytest.raises(ValueError):
        metadata_pb.decode_list(metadata_pb.MAGIC + _field(2, _field(2, _field(1, item))))


@pytest.mark.parametrize("list_metas, token", [
    ([_text(3, "a")], "a"),
    ([_text(3, "a"), _text(2, "7")], "a"),       # a repeated ListMeta merges: no continue keeps "a"
    ([_text(3, "a"), _text(3, "")], None),       # an explicit empty continue replaces it
    ([_text(3, "a"), _text(3, "b")], "b"),
])
def test_a_repeated_list_meta_merges_as_protobuf_says(list_metas, token):
    envelope = metadata_pb.MAGIC + _field(2, b"".join(_field(1, meta) for meta in list_metas))

    assert metadata_pb.decode_list(envelope)[1] == token
    assert metadata_pb.continue_token(envelope) == token


def _page(*items: bytes) -> bytes:
    return metadata_pb.MAGIC + _field(2, b"".join(_field(2, _field(1, item)) for item in items))


def _pod(name: str, annotations: dict[bytes, bytes]) -> bytes:
    return _text(1, name) + _text(3, "ns") + _text(5, f"uid-{name}") + b"".join(
        _field(12, _field(1, key) + _field(2, value)) for key, value in annotations.items())


def test_bytes_that_are_not_utf8_cost_that_pod_alone():
    """Issue 45 item 4: a protobuf client can write an annotation that is not UTF-8, and the
    apiserver keeps it. Decoded strictly, it failed the whole page (a ValueError: an API error),
    so the in-flight list, the sweep, revoke's listing and the CLI failed for the namespace. Now
    the page reads, and that pod alone is malformed."""
    from fenced_k8s_executor import pods
    from fenced_k8s_executor.launch import LaunchIdentity

    good = LaunchIdentity(ti_id="0b3a3d2c-7f4e-4c1a-9d2b-5e6f7a8b9c0d", token="5f0c6d1e-2a3b-4c4d-8e5f-6a7b8c9d0e1f",
                          try_number=1, scheduler_job_id="7", dag_id="d", task_id="t", run_id="r", deployment="db")
    annotations = {k.encode(): v.encode() for k, v in {**good.annotations(), "dag_id": "d", "task_id": "t",
                                                        "run_id": "r"}.items()}
    bad = {**annotations, b"fenced-k8s-executor.io/region-id": b"\xff\xfe\x00", b"dag_id": b"d\xc3"}

    refs = pods._refs(_page(_pod("good", annotations), _pod("bad", bad), _pod("\xe9", annotations)))

    assert [ref.name for ref in refs] == ["good", "bad", "\xe9"]
    assert refs[0].launch == good and refs[2].launch == good
    assert refs[1].launch.malformed.startswith("dag_id ") and refs[1].launch.task is None


@given(value=st.binary(max_size=300), key=st.binary(max_size=40))
def test_any_bytes_in_a_pods_strings_read_back_exactly(value, key):
    """Lenient, not lossy: what the client wrote is what ``surrogateescape`` gives back."""
    item = _field(1, b"p\xff") + _field(12, _field(1, key) + _field(2, value))
    (meta,), _ = metadata_pb.decode_list(_page(item))
    (read_key, read_value), = meta["annotations"].items()
    assert read_key.encode("utf-8", "surrogateescape") == key
    assert read_value.encode("utf-8", "surrogateescape") == value
    assert meta["name"].encode("utf-8", "surrogateescape") == b"p\xff"
