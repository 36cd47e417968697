"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a strategic-merge approximation. Pure.

The strategic merge here knows the merge keys of the Pod fields an executor or kubelet touches
(containers by name, env by name, conditions by type, ...), unions `metadata.finalizers`, and
honours `$patch: delete|replace` and `$deleteFromPrimitiveList`. It does not read OpenAPI
schemas, so lists it does not know are replaced, as a merge patch would.
Every function returns a new value and never mutates its inputs.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["PatchError", "PatchDecodeError", "merge_patch", "strategic_merge_patch", "json_patch"]


class PatchError(ValueError):
    """The patch is well formed but cannot be applied (kube answers 422)."""


class PatchDecodeError(ValueError):
    """The patch document itself is malformed (kube answers 400)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Merge keys by field name (path-independent is good enough for Pods and Namespaces).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ephemeralContainerStatuses": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
}
# Lists of scalars with patchStrategy "merge": union instead of replace.
_MERGE_SETS = {"finalizers"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Approximate kube's strategic merge patch for Pod-shaped documents."""
    if not isinstance(patch, dict):
        raise PatchDecodeError("strategic merge patch must be a JSON object")
    return _smp_map(target if isinstance(target, dict) else {}, patch)


def _smp_map(target: dict, patch: dict) -> dict:
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return {}
    result = copy.deepcopy(target)
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            cur = result.get(key)
            result[key] = _smp_map(cur if isinstance(cur, dict) else {}, value)
        elif isinstance(value, list):
            result[key] = _smp_list(key, result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _smp_list(field: str, current: Any, patch: list) -> list:
    current = current if isinstance(current, list) else []
    if field in _MERGE_SETS:
        out = list(current)
        for v in patch:
            if v not in out:
                out.append(copy.deepcopy(v))
        return out
    key = _MERGE_KEYS.get(field)
    if key is None or not all(isinstance(p, dict) for p in patch):
        return copy.deepcopy(patch)
    if any(p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if p.get("$patch") != "replace"]
    out = copy.deepcopy(current)
    for item in patch:
        if key not in item:
            raise PatchError(f"map: {item} does not contain declared merge key: {key}")
        idx = next((i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append(_smp_map({}, item))
        else:
            out[idx] = _smp_map(out[idx], item)
    return out


# ---------------------------------------------------------------- RFC 6902


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchDecodeError(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for p in parts:
        doc = _child(doc, p, path)
    return doc


def _child(node: Any, part: str, path: str) -> Any:
    if isinstance(node, dict):
        if part not in node:
            raise PatchError(f"path {path!r} does not exist")
        return node[part]
    if isinstance(node, list):
        return node[_index(node, part, path, allow_end=False)]
    raise PatchError(f"path {path!r} does not exist")


def _index(lst: list, part: str, path: str, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(lst)
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchError(f"invalid array index {part!r} in {path!r}")
    i = int(part)
    if i > len(lst) or (i == len(lst) and not allow_end):
        raise PatchError(f"array index {i} out of bounds in {path!r}")
    return i


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, path, allow_end=True), value)
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        raise PatchError("cannot remove the document root")
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {last}: missing value")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, path, allow_end=False))
    raise PatchError(f"path {path!r} does not exist")


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 add/remove/replace/move/copy/test over a deep copy of target."""
    if not isinstance(ops, list) or not all(isinstance(o, dict) for o in ops):
        raise PatchDecodeError("json patch must be a list of operation objects")
    doc = copy.deepcopy(target)
    for op in ops:
        kind = op.get("op")
        path = op.get("path")
        parts = _pointer(path)
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchDecodeError(f"operation {kind!r} is missing 'value'")
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path)
        elif kind == "remove":
            _remove(doc, parts, path)
        elif kind == "replace":
            _walk(doc, parts, path)  # must exist
            if parts:
                _remove(doc, parts, path)
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path)
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from"))
            value = copy.deepcopy(_walk(doc, src, op.get("from")))
            if kind == "move":
                if parts[: len(src)] == src and len(parts) > len(src):
                    raise PatchError("cannot move a value into one of its children")
                _remove(doc, src, op.get("from"))
            doc = _add(doc, parts, value, path)
        elif kind == "test":
            if _walk(doc, parts, path) != op["value"]:
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchDecodeError(f"unexpected operation {kind!r}")
    return doc
