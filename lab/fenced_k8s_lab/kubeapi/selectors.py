"""Label and field selectors, parsed and matched the way kube-apiserver does. Pure.

Kept apart from the server so the grammar can be unit-tested (and property-tested) without
HTTP, and so the server stays a thin shell: parse once per request, then `matches(obj)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "SelectorError",
    "LabelSelector",
    "FieldSelector",
    "parse_label_selector",
    "parse_field_selector",
    "validate_labels",
    "validate_annotations",
    "POD_FIELDS",
    "NAMESPACE_FIELDS",
    "LEASE_FIELDS",
]


class SelectorError(ValueError):
    """Malformed or unsupported selector: the server answers 400 BadRequest."""


_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _key_error(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"prefix part of {key!r} must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _NAME.match(name):
        return f"name part of {key!r} must be 63 characters or less, alphanumeric, '-', '_' or '.'"
    return None


def _value_error(value: str) -> str | None:
    if value == "":
        return None
    if len(value) > 63 or not _NAME.match(value):
        return f"invalid label value {value!r}: 63 characters or less, alphanumeric, '-', '_' or '.'"
    return None


def validate_labels(labels: object) -> list[str]:
    """Problems with a metadata.labels map (empty list when valid); the server answers 422."""
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return ["metadata.labels: must be a map of string to string"]
    errors = []
    for k, v in labels.items():
        if not isinstance(v, str):
            errors.append(f"metadata.labels[{k}]: value must be a string")
            continue
        problem = _key_error(k) or _value_error(v)
        if problem:
            errors.append(f"metadata.labels: Invalid value: {problem}")
    return errors


ANNOTATIONS_MAX_BYTES = 256 * 1024  # kube's TotalAnnotationSizeLimitB: keys plus values, in bytes


def validate_annotations(annotations: object) -> list[str]:
    """Problems with a metadata.annotations map (422): every key a qualified name (checked lower-cased,
    as kube does), and keys plus values at most 256 KiB in all."""
    if not isinstance(annotations, dict):
        return []
    errors = []
    for k in annotations:
        problem = _key_error(str(k).lower())
        if problem:
            errors.append(f'metadata.annotations: Invalid value: "{k}": {problem}')
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        errors.append(f"metadata.annotations: Too long: may not be more than {ANNOTATIONS_MAX_BYTES} bytes")
    return errors


# ---------------------------------------------------------------- label selectors


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict) -> bool:
        has = self.key in labels
        val = labels.get(self.key)
        if self.op == "=":
            return has and val == self.values[0]
        if self.op == "in":
            return has and val in self.values
        if self.op == "!=":
            return not has or val != self.values[0]
        if self.op == "notin":
            return not has or val not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if not has:
            return False
        try:
            n = int(val)
        except ValueError:
            return False
        bound = int(self.values[0])
        return n > bound if self.op == "gt" else n < bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: dict | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


_TOKEN = re.compile(r"\s*(==|!=|=|>|<|\(|\)|,|!|[^\s=!<>(),]+)")


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise SelectorError(f"unable to parse requirement: {text!r}")
        tokens.append(m.group(1))
        pos = m.end()
    return tokens


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse `a=b,c!=d,e in (f,g),h notin (i),j,!k,l>3` into a LabelSelector."""
    if not text or not text.strip():
        return LabelSelector()
    toks = _tokenize(text)
    reqs: list[Requirement] = []
    i = 0

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise SelectorError(f"unable to parse requirement: {what} in {text!r}")

    while i < len(toks):
        negate = toks[i] == "!"
        if negate:
            i += 1
        need(i < len(toks) and toks[i] not in ("=", "==", "!=", "(", ")", "<", ">", ",", "!"), "expected a key")
        key = toks[i]
        i += 1
        err = _key_error(key)
        if err:
            raise SelectorError(f"invalid label key {key!r}: {err}")
        if negate:
            reqs.append(Requirement(key, "!"))
        elif i >= len(toks) or toks[i] == ",":
            reqs.append(Requirement(key, "exists"))
        elif toks[i] in ("=", "==", "!="):
            op = "!=" if toks[i] == "!=" else "="
            i += 1
            value = ""
            if i < len(toks) and toks[i] not in (",", "(", ")", "=", "==", "!=", "!"):
                value = toks[i]
                i += 1
            err = _value_error(value)
            if err:
                raise SelectorError(err)
            reqs.append(Requirement(key, op, (value,)))
        elif toks[i] in ("in", "notin"):
            op = toks[i]
            i += 1
            need(i < len(toks) and toks[i] == "(", "expected '('")
            i += 1
            values: list[str] = []
            while True:
                need(i < len(toks), "expected ')'")
                if toks[i] == ")":
                    i += 1
                    break
                if toks[i] == ",":
                    values.append("")  # kube allows empty values in sets, e.g. "in (,a)"
                    i += 1
                    continue
                err = _value_error(toks[i])
                if err:
                    raise SelectorError(err)
                values.append(toks[i])
                i += 1
                need(i < len(toks) and toks[i] in (",", ")"), "expected ',' or ')'")
                if toks[i] == ",":
                    i += 1
            # kube-apiserver accepts an empty set: "k in ()" matches nothing, "k notin ()" everything
            reqs.append(Requirement(key, op, tuple(values)))
        elif toks[i] in (">", "<"):
            op = "gt" if toks[i] == ">" else "lt"
            i += 1
            need(i < len(toks) and re.fullmatch(r"-?\d+", toks[i]) is not None, "expected an integer")
            reqs.append(Requirement(key, op, (toks[i],)))
            i += 1
        else:
            raise SelectorError(f"unable to parse requirement: unexpected {toks[i]!r} in {text!r}")
        if i < len(toks):
            need(toks[i] == ",", "expected ','")
            i += 1
            need(i < len(toks), "trailing ','")
    return LabelSelector(tuple(reqs))


# ---------------------------------------------------------------- field selectors


def _get(obj: dict, dotted: str, default: str = "") -> str:
    cur: object = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return default
        cur = cur.get(part)
    if cur is None:
        return default
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


#: Field labels kube-apiserver supports for pods (pkg/registry/core/pod/strategy.go).
POD_FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
NAMESPACE_FIELDS = frozenset({"metadata.name", "status.phase"})
LEASE_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[tuple[str, bool, str], ...] = ()  # (field, equal?, value)

    def matches(self, obj: dict) -> bool:
        for field, equal, value in self.terms:
            actual = _get(obj, field, "false" if field == "spec.hostNetwork" else "")
            if (actual == value) != equal:
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.terms


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if c == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur))
    return parts


def _unescape(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=!":
                raise SelectorError(f"invalid field selector value escape in {value!r}")
            out.append(value[i + 1])
            i += 2
        else:
            if value[i] in ",=":
                raise SelectorError(f"invalid field selector: unescaped {value[i]!r} in {value!r}")
            out.append(value[i])
            i += 1
    return "".join(out)


def parse_field_selector(text: str | None, supported: frozenset[str]) -> FieldSelector:
    """Parse `a=b,c!=d,e==f`; unknown field labels raise SelectorError (400 in kube)."""
    if not text or not text.strip():
        return FieldSelector()
    terms = []
    for part in _split_unescaped(text, ","):
        part = part.strip()
        m = re.match(r"^([^=!]+?)\s*(==|!=|=)(.*)$", part)
        if not m:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if field not in supported:
            raise SelectorError(f'field label not supported: {field}')
        terms.append((field, op != "!=", _unescape(value)))
    return FieldSelector(tuple(terms))
