"""Write a kubeconfig for a plain-HTTP API server (the emulator) with a bearer token.

Each token gets its own user and context, so several callers (e.g. two schedulers) can share
one file and pick a context, or get one file each; the emulator attributes requests by token.
"""

from __future__ import annotations

import json
import os
import re

__all__ = ["write_kubeconfig", "kubeconfig_dict"]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "anonymous"


def kubeconfig_dict(server: str, tokens: list[str | None] | None = None, namespace: str = "default",
                    names: list[str] | None = None, current: int = 0) -> dict:
    """One cluster, and one user+context per token (None means anonymous)."""
    tokens = list(tokens) if tokens else [None]
    names = names or [_slug(t[:12]) if t else "anonymous" for t in tokens]
    users, contexts = [], []
    for name, token in zip(names, tokens):
        users.append({"name": name, "user": {"token": token} if token else {}})
        contexts.append({"name": name, "context": {"cluster": "emulator", "user": name, "namespace": namespace}})
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": users,
        "contexts": contexts,
        "current-context": names[current],
        "preferences": {},
    }


def write_kubeconfig(path: str | os.PathLike, server: str, token: str | None = None, *,
                     namespace: str = "default", extra_tokens: list[str] | None = None,
                     context_names: list[str] | None = None) -> str:
    """Write a kubeconfig (JSON is valid YAML) whose current context uses `token`; returns the path."""
    cfg = kubeconfig_dict(server, [token, *(extra_tokens or [])], namespace, context_names)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(cfg, fh, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path
