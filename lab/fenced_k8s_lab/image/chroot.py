"""Run a command inside a root filesystem folder: chroot in a private mount namespace.

The child process (and only it) gets its own mount namespace, made recursively private *before*
anything is mounted, so /proc, /dev, /etc/resolv.conf and the build-only binds (host CA bundle,
pip cache) never show on the host and vanish when the last process of the namespace exits: no
unmount step that a crash could skip. Needs root (CAP_SYS_ADMIN, CAP_SYS_CHROOT).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.unshare.argtypes = [ctypes.c_int]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                       flags, None), f"mount {src} {target}")


@dataclass
class Bind:
    """A host path bound at `target` (absolute, inside the rootfs) for one command only."""

    source: str
    target: str
    readonly: bool = False


@dataclass
class Jail:
    """How to run a command in `root`: as `uid:gid` (supplementary groups none), in `cwd`, with
    exactly `env` (nothing inherited from the host), and extra `binds`."""

    root: Path
    uid: int = 0
    gid: int = 0
    cwd: str = "/"
    env: dict = field(default_factory=dict)
    binds: list = field(default_factory=list)
    umask: int | None = None

    def _mountpoints(self) -> list[tuple[Path, bool]]:
        """Creates missing mount targets; returns those created (path, is_dir) to remove later."""
        made = []
        for b in [Bind("/etc/resolv.conf", "/etc/resolv.conf")] + list(self.binds):
            t = self.root / b.target.lstrip("/")
            if os.path.lexists(t):
                continue
            t.parent.mkdir(parents=True, exist_ok=True)
            if os.path.isdir(b.source):
                t.mkdir()
                made.append((t, True))
            else:
                t.touch()
                made.append((t, False))
        return made

    def _preexec(self) -> None:  # runs in the child between fork and exec
        root = str(self.root)
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        # Nothing below may propagate to the host's namespace: refuse to go on otherwise.
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount("proc", os.path.join(root, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _mount("/dev", os.path.join(root, "dev"), None, MS_BIND | MS_REC)
        for b in [Bind("/etc/resolv.conf", "/etc/resolv.conf", True)] + list(self.binds):
            if not os.path.exists(b.source):
                continue
            t = os.path.join(root, b.target.lstrip("/"))
            _mount(b.source, t, None, MS_BIND)
            if b.readonly:
                _mount(None, t, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.chroot(root)
        os.chdir(self.cwd or "/")
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)
        if self.umask is not None:
            os.umask(self.umask)

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """Starts argv[0] (an absolute path inside the rootfs). The Popen's pid is the command
        itself (no wrapper), so it can be stopped by PID."""
        if not argv[0].startswith("/"):
            raise ValueError(f"argv[0] must be an absolute path inside the rootfs: {argv[0]!r}")
        for d in ("proc", "dev"):
            (self.root / d).mkdir(exist_ok=True)
        self._made = self._mountpoints()
        return subprocess.Popen(argv, env={k: str(v) for k, v in self.env.items()},
                                preexec_fn=self._preexec, **kw)

    def cleanup(self) -> None:
        """Removes the mount targets that popen created (call once the command has ended)."""
        for p, is_dir in reversed(getattr(self, "_made", [])):
            try:
                p.rmdir() if is_dir else p.unlink()
            except OSError:
                pass
        self._made = []

    def run(self, argv: list[str], check: bool = True, timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
        if kw.pop("capture_output", False):
            kw["stdout"] = kw["stderr"] = subprocess.PIPE
        p = self.popen(argv, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except BaseException:
            p.kill()
            p.wait()
            raise
        finally:
            self.cleanup()
        cp = subprocess.CompletedProcess(argv, p.returncode, out, err)
        if check and p.returncode != 0:
            raise subprocess.CalledProcessError(p.returncode, argv, out, err)
        return cp

    def sh(self, script: str, **kw) -> subprocess.CompletedProcess:
        return self.run(["/bin/sh", "-c", script], **kw)


def user_ids(root: Path, spec: str) -> tuple[int, int, str]:
    """`user[:group]` (names or numbers) -> (uid, gid, home), resolved in the rootfs's passwd/group
    files like the container runtime would."""
    user, _, group = spec.partition(":")
    passwd = [line.split(":") for line in (root / "etc/passwd").read_text().splitlines() if line.count(":") >= 6]
    groups = [line.split(":") for line in (root / "etc/group").read_text().splitlines() if line.count(":") >= 2]
    ent = next((e for e in passwd if e[0] == user or (user.isdigit() and e[2] == user)), None)
    if ent is None and not user.isdigit():
        raise ValueError(f"user {user!r} not found in {root}/etc/passwd")
    uid = int(ent[2]) if ent else int(user)
    gid = int(ent[3]) if ent else 0
    home = ent[5] if ent else "/"
    if group:
        g = next((e for e in groups if e[0] == group), None)
        if g is None and not group.isdigit():
            raise ValueError(f"group {group!r} not found in {root}/etc/group")
        gid = int(g[2]) if g else int(group)
    return uid, gid, home


def chown_tree(path: Path, uid: int, gid: int) -> None:
    os.lchown(path, uid, gid)
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for n in dirnames + filenames:
                os.lchown(os.path.join(dirpath, n), uid, gid)


def tar_create(src: Path, out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(src), "-cf", str(tmp), "."], check=True)
    os.replace(tmp, out)


def tar_extract(tar: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "--numeric-owner", "--xattrs", "--same-permissions", "-C", str(dest), "-xf", str(tar)],
                   check=True)


def rmtree(path: Path) -> None:
    """Removes a rootfs work dir; refuses if anything is still mounted below it (which the private
    namespaces should make impossible)."""
    if not path.exists():
        return
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if mp == real or mp.startswith(real + "/"):
                raise RuntimeError(f"refusing to delete {path}: {mp} is mounted")
    shutil.rmtree(path)


class Timer:
    """Collects (phase, seconds) and prints each as it ends."""

    def __init__(self, say=print):
        self.say = say
        self.phases: list[tuple[str, float]] = []

    def __call__(self, name: str):
        timer = self

        class _Phase:
            def __enter__(self):
                self.t0 = time.monotonic()
                timer.say(f"[image] {name} ...")

            def __exit__(self, *exc):
                dt = time.monotonic() - self.t0
                timer.phases.append((name, dt))
                timer.say(f"[image] {name}: {dt:.1f}s" + (" (failed)" if exc[0] else ""))

        return _Phase()
