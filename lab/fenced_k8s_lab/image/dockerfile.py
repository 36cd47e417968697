"""A Dockerfile interpreter for exactly the instructions the repo's Dockerfile uses.

Supported: the `# syntax=` directive and comments; `ARG NAME[=default]` (global before the first
FROM, re-declared inside a stage to be visible there; `--build-arg`-style overrides); `FROM image
[AS stage]` (`apache/airflow:<tag>` -> the stand-in base, an earlier stage -> a copy of it);
`USER`; `COPY [--chown=u:g] src... dst` from the build context honouring `.dockerignore`;
`COPY [--chown=u:g] <<'EOF' dst` (quoted heredoc, no expansion); `RUN` in shell form
(`/bin/sh -c`, as the current USER with the image env and the stage's ARGs). Anything else raises
`Unsupported` naming the instruction and line, so a Dockerfile change the interpreter cannot
follow fails loudly instead of silently building something else.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path


class Unsupported(Exception):
    """The Dockerfile uses something this interpreter does not reproduce."""


@dataclass
class Instruction:
    line: int
    cmd: str           # upper-case keyword
    args: str          # the rest, continuation lines joined
    heredoc: str | None = None  # body of a heredoc (COPY <<'EOF')

    def where(self) -> str:
        return f"Dockerfile line {self.line}: {self.cmd} {self.args[:80]}"


_HEREDOC = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def parse(text: str) -> list[Instruction]:
    lines = text.splitlines()
    out: list[Instruction] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        s = raw.strip()
        if not s or s.startswith("#"):
            i += 1
            continue
        start = i + 1
        buf = s
        while buf.endswith("\\"):
            buf = buf[:-1].rstrip()
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].strip().startswith("#")):
                i += 1  # comment and empty lines inside a continuation are dropped, as docker does
            if i >= len(lines):
                break
            buf += " " + lines[i].strip()
        i += 1
        cmd, _, args = buf.partition(" ")
        ins = Instruction(start, cmd.upper(), args.strip())
        m = _HEREDOC.search(ins.args)
        if m:
            if _HEREDOC.search(ins.args, m.end()):
                raise Unsupported(f"{ins.where()}: more than one heredoc")
            if not m.group(2):
                raise Unsupported(f"{ins.where()}: unquoted heredoc (variable expansion) is not reproduced;"
                                  f" quote the delimiter: <<'{m.group(3)}'")
            body = []
            while i < len(lines) and (lines[i].lstrip("\t") if m.group(1) else lines[i]) != m.group(3):
                body.append(lines[i].lstrip("\t") if m.group(1) else lines[i])
                i += 1
            if i >= len(lines):
                raise Unsupported(f"{ins.where()}: heredoc {m.group(3)} never ends")
            i += 1
            ins.heredoc = "\n".join(body) + "\n"
            ins.args = (ins.args[:m.start()] + "-" + ins.args[m.end():]).strip()
        out.append(ins)
    return out


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand(s: str, env: dict) -> str:
    """Docker's variable substitution for FROM/USER/COPY: $VAR, ${VAR}, ${VAR:-default}."""
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in env and env[name] != "":
            return env[name]
        return m.group(2) or ""
    if "${" in s and re.search(r"\$\{[^}]*[#%/^,][^}]*\}", s):
        raise Unsupported(f"variable modifier in {s!r} (only $V, ${{V}}, ${{V:-d}} outside RUN)")
    return _VAR.sub(sub, s)


# --- .dockerignore -------------------------------------------------------------------------------

def _pattern_regex(pat: str) -> re.Pattern:
    """Docker's (moby patternmatcher) syntax: Go filepath.Match plus `**` for any number of dirs."""
    out, i = "", 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**", i):
            i += 2
            if pat.startswith("/", i):
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            j = pat.find("]", i)
            if j < 0:
                out += re.escape(c)
            else:
                cls = pat[i + 1:j]
                if cls.startswith("^"):
                    cls = "!" + cls[1:]
                out += fnmatch.translate("[" + cls + "]")[4:-3]  # reuse fnmatch's class handling
                i = j
        elif c == "\\" and i + 1 < len(pat):
            i += 1
            out += re.escape(pat[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


class DockerIgnore:
    def __init__(self, text: str):
        self.rules: list[tuple[bool, re.Pattern, int]] = []
        for line in text.splitlines():
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            neg = s.startswith("!")
            if neg:
                s = s[1:].strip()
            s = os.path.normpath(s.lstrip("/")) if s.lstrip("/") else "."
            self.rules.append((neg, _pattern_regex(s), s.count("/") + 1))

    def excluded(self, rel: str) -> bool:
        """Whether path `rel` (relative to the context, '/'-separated) is left out: the last rule
        matching the path or one of its parent dirs decides, as moby's MatchesOrParentMatches."""
        parts = rel.split("/")
        parents = ["/".join(parts[:k]) for k in range(1, len(parts))]
        hit = False
        for neg, rx, _ in self.rules:
            if rx.match(rel) or any(rx.match(p) for p in parents):
                hit = not neg
        return hit

    def has_exceptions(self) -> bool:
        return any(neg for neg, _, _ in self.rules)


def copy_context(context: Path, ignore: DockerIgnore, srcs: list[str], dst: Path, dst_is_dir: bool,
                 uid: int, gid: int) -> int:
    """COPY srcs (relative to context) to dst in the rootfs, like docker: a directory's *contents*
    go into dst; every file and directory created gets uid:gid. Returns the number of files."""
    n = 0
    created = []

    def mk(d: Path) -> None:
        missing = []
        p = d
        while not p.exists():
            missing.append(p)
            p = p.parent
        for m in reversed(missing):
            m.mkdir()
            created.append(m)

    for src in srcs:
        if any(c in src for c in "*?["):
            raise Unsupported(f"COPY source with wildcards: {src!r}")
        rel0 = os.path.normpath(src.lstrip("/"))
        if rel0.startswith(".."):
            raise Unsupported(f"COPY source outside the context: {src!r}")
        s = context / rel0
        if not s.exists():
            raise FileNotFoundError(f"COPY source not in the build context: {src}")
        if s.is_dir():
            mk(dst)
            for dirpath, dirnames, filenames in os.walk(s):
                rdir = os.path.relpath(dirpath, context)
                keep = []
                for d in sorted(dirnames):
                    rel = os.path.normpath(os.path.join(rdir, d))
                    if ignore.excluded(rel) and not ignore.has_exceptions():
                        continue
                    keep.append(d)
                dirnames[:] = keep
                for name in sorted(dirnames) + sorted(filenames):
                    rel = os.path.normpath(os.path.join(rdir, name))
                    full = os.path.join(dirpath, name)
                    if ignore.excluded(rel) and not os.path.isdir(full):
                        continue
                    target = dst / os.path.relpath(full, s)
                    if os.path.islink(full):
                        os.symlink(os.readlink(full), target)
                    elif os.path.isdir(full):
                        target.mkdir(exist_ok=True)
                    else:
                        shutil.copy2(full, target)
                        n += 1
                    os.lchown(target, uid, gid)
        else:
            if ignore.excluded(rel0):
                raise FileNotFoundError(f"COPY source excluded by .dockerignore: {src}")
            target = dst / s.name if dst_is_dir else dst
            mk(target.parent)
            shutil.copy2(s, target)
            os.lchown(target, uid, gid)
            n += 1
    for d in created:
        os.lchown(d, uid, gid)
    return n


def split_flags(args: str, allowed: set[str], ins: Instruction) -> tuple[dict, list[str]]:
    words = shlex.split(args, posix=True)
    flags = {}
    while words and words[0].startswith("--"):
        k, _, v = words.pop(0)[2:].partition("=")
        if k not in allowed:
            raise Unsupported(f"{ins.where()}: flag --{k} is not reproduced")
        flags[k] = v
    return flags, words
