"""`fenced-k8s-repro image`: build the runtime/kind image (the repo's Dockerfile on the apache/airflow
stand-in) or the PostgreSQL image, pack it with ../shared/node/mkimage.py, optionally load it."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fenced_k8s_lab.image import base as B
from fenced_k8s_lab.image.chroot import Jail, Timer, rmtree, tar_extract, user_ids
from fenced_k8s_lab.image.dockerfile import (DockerIgnore, Instruction, Unsupported, copy_context,
                                                      expand, parse, split_flags)
from fenced_k8s_lab.image.wheel import RUNTIME, build_wheel

DEFAULT_NAMES = {"kind": "localhost/fenced-k8s-executor:dev", "runtime": "localhost/fenced-k8s-executor:runtime"}
POSTGRES_NAME = f"localhost/fenced/postgres:{B.POSTGRES_MAJOR}"
STANDIN_REPO = "apache/airflow"


def repo_root() -> Path:
    """$FENCED_REPO, else the checkout this package lives in (editable install), else the cwd."""
    if os.environ.get("FENCED_REPO"):
        return Path(os.environ["FENCED_REPO"]).resolve()
    here = Path(__file__).resolve().parents[3]
    if (here / "Dockerfile").exists() and (here / "pyproject.toml").exists():
        return here
    return Path.cwd().resolve()


def node_tool(repo: Path, name: str, env: str) -> Path:
    """A script of the shared node (`../shared/node/NAME` next to the repo), or $ENV."""
    return Path(os.environ[env]) if os.environ.get(env) else (repo.parent / "shared" / "node" / name)


@dataclass
class Stage:
    name: str
    root: Path
    env: dict
    user: str
    workdir: str
    entrypoint: list
    cmd: list
    args: dict = field(default_factory=dict)


class Builder:
    def __init__(self, repo: Path, work: Path, bases: B.Bases, timer: Timer, build_args: dict, say=print):
        self.repo, self.work, self.bases, self.timer, self.say = repo, work, bases, timer, say
        self.build_args = build_args
        self.stages: dict[str, Stage] = {}

    def _from(self, image: str, name: str, refs_left: int) -> Stage:
        if image in self.stages:
            prev = self.stages[image]
            root = self.work / f"stage-{name}"
            if refs_left == 0:  # nobody needs the earlier stage any more: continue it in place
                prev.root.rename(root)
            else:
                with self.timer(f"copy stage {image} for {name}"):
                    subprocess.run(["cp", "-a", str(prev.root), str(root)], check=True)
            return Stage(name, root, dict(prev.env), prev.user, prev.workdir, list(prev.entrypoint), list(prev.cmd))
        repo_, _, tag = image.partition(":")
        if repo_ not in (STANDIN_REPO, f"docker.io/{STANDIN_REPO}"):
            raise Unsupported(f"FROM {image}: only {STANDIN_REPO}:<tag> (the stand-in) or an earlier stage")
        version = tag.split("-")[0]
        if version != self.bases.airflow_version:
            raise Unsupported(f"FROM {image}: the stand-in is built for Airflow {self.bases.airflow_version}"
                              f" (from the constraints file); pass --airflow-version {version} with matching constraints")
        if tag not in (version, f"{version}-python{B.STANDIN_PYTHON}"):
            self.say(f"[image] note: tag {tag}: the stand-in has Debian's Python {B.STANDIN_PYTHON} whatever the tag's"
                     " suffix says")
        tar = self.bases.airflow_tar()
        root = self.work / f"stage-{name}"
        with self.timer(f"unpack the {STANDIN_REPO}:{version} stand-in"):
            tar_extract(tar, root)
        return Stage(name, root, dict(B.AIRFLOW_ENV), B.AIRFLOW_USER, B.AIRFLOW_WORKDIR,
                     list(B.AIRFLOW_ENTRYPOINT), [])

    def build(self, dockerfile: Path, target: str) -> Stage:
        instrs = parse(dockerfile.read_text())
        # Split into the global part and the stages.
        glob: list[Instruction] = []
        stages: list[tuple[Instruction, list[Instruction]]] = []
        for ins in instrs:
            if ins.cmd == "FROM":
                stages.append((ins, []))
            elif not stages:
                if ins.cmd != "ARG":
                    raise Unsupported(f"{ins.where()}: only ARG may come before the first FROM")
                glob.append(ins)
            else:
                stages[-1][1].append(ins)
        gargs: dict[str, str] = {}
        for ins in glob:
            k, eq, v = ins.args.partition("=")
            gargs[k.strip()] = self.build_args.get(k.strip(), v if eq else "")
        # Which stages the target needs (BuildKit skips the others).
        parsed = []
        for ins, body in stages:
            words = ins.args.split()
            if len(words) == 3 and words[1].upper() == "AS":
                image, name = expand(words[0], gargs), words[2]
            elif len(words) == 1:
                image, name = expand(words[0], gargs), str(len(parsed))
            else:
                raise Unsupported(f"{ins.where()}: FROM flags (--platform) are not reproduced")
            parsed.append((image, name, ins, body))
        names = [p[1] for p in parsed]
        if target not in names:
            raise SystemExit(f"no stage {target!r} in {dockerfile} (stages: {', '.join(names)})")
        need, todo = set(), [target]
        while todo:
            n = todo.pop()
            need.add(n)
            image = parsed[names.index(n)][0]
            if image in names and image not in need:
                todo.append(image)
        order = [p for p in parsed[:names.index(target) + 1] if p[1] in need]
        for idx, (image, name, ins, body) in enumerate(order):
            refs_left = sum(1 for p in order[idx + 1:] if p[0] == image)
            with self.timer(f"stage {name} (FROM {image})"):
                st = self._from(image, name, refs_left)
                for b in body:
                    self._step(st, b, gargs)
                self.stages[name] = st
        return self.stages[target]

    def _step(self, st: Stage, ins: Instruction, gargs: dict) -> None:
        scope = {**st.env, **st.args}
        if ins.cmd == "ARG":
            k, eq, v = ins.args.partition("=")
            k = k.strip()
            if " " in k or not k:
                raise Unsupported(f"{ins.where()}: one ARG per line")
            st.args[k] = self.build_args.get(k, expand(v, scope) if eq else gargs.get(k, ""))
        elif ins.cmd == "USER":
            st.user = expand(ins.args, scope)
            user_ids(st.root, st.user)  # fails now if the user does not exist
        elif ins.cmd == "COPY":
            flags, words = split_flags(ins.args, {"chown"}, ins)
            words = [expand(w, scope) for w in words]
            uid, gid = 0, 0
            if "chown" in flags:
                uid, gid, _ = user_ids(st.root, expand(flags["chown"], scope))
            if len(words) < 2:
                raise Unsupported(f"{ins.where()}: COPY needs a source and a destination")
            dst_s = words[-1]
            dst_abs = dst_s if dst_s.startswith("/") else os.path.join(st.workdir, dst_s)
            dst = st.root / dst_abs.lstrip("/")
            if ins.heredoc is not None:
                if words[:-1] != ["-"]:
                    raise Unsupported(f"{ins.where()}: a heredoc COPY takes exactly the heredoc and a destination")
                target = dst / "-" if dst_s.endswith("/") else dst
                copy_context_mk(target.parent, uid, gid)
                target.write_text(ins.heredoc)
                os.chmod(target, 0o644)
                os.lchown(target, uid, gid)
            else:
                ignore_file = self.repo / ".dockerignore"
                ignore = DockerIgnore(ignore_file.read_text() if ignore_file.exists() else "")
                if ignore.has_exceptions():
                    raise Unsupported(".dockerignore exceptions (!pattern) are not reproduced")
                srcs = words[:-1]
                dst_is_dir = dst_s.endswith("/") or len(srcs) > 1 or dst.is_dir()
                n = copy_context(self.repo, ignore, srcs, dst, dst_is_dir, uid, gid)
                self.say(f"[image]   COPY {' '.join(srcs)} -> {dst_abs}: {n} files")
        elif ins.cmd == "RUN":
            if ins.args.startswith("[") or ins.args.startswith("--"):
                raise Unsupported(f"{ins.where()}: only the shell form of RUN without flags is reproduced")
            uid, gid, home = user_ids(st.root, st.user)
            env = {"PATH": B.BASE_PATH, "HOME": home, "HOSTNAME": "buildkitsandbox", **st.env, **st.args}
            extra, binds = B.build_env()  # host CA / index / proxy for this step only
            env.update(extra)
            with self.timer(f"RUN (line {ins.line}) as {st.user}"):
                Jail(st.root, uid=uid, gid=gid, cwd=st.workdir, env=env, binds=binds).run(
                    ["/bin/sh", "-c", ins.args])
        else:
            raise Unsupported(f"{ins.where()}: instruction {ins.cmd} is not reproduced by the stand-in builder"
                              " (lab/fenced_k8s_lab/image/dockerfile.py); extend it or build with docker")


def copy_context_mk(d: Path, uid: int, gid: int) -> None:
    missing = []
    while not d.exists():
        missing.append(d)
        d = d.parent
    for m in reversed(missing):
        m.mkdir()
        os.lchown(m, uid, gid)


def mkimage(tool: Path, root: Path, name: str, out: Path, entrypoint: list, cmd: list, env: dict,
            workdir: str, user: str) -> None:
    if "--" in entrypoint:
        # mkimage.py's argparse cannot take a literal "--" value. dumb-init stops reading its own
        # options at the first non-option argument, so ["dumb-init", "/entrypoint"] is the same.
        entrypoint = [a for a in entrypoint if a != "--"]
    argv = [sys.executable, str(tool), str(root), name, str(out), "--workdir", workdir, "--user", user,
            "--entrypoint", *entrypoint]
    if cmd:
        argv += ["--cmd", *cmd]
    else:
        argv += ["--cmd"]
    for k, v in env.items():
        argv += ["--env", f"{k}={v}"]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fenced-k8s-repro image",
        description="Build the project's image from its Dockerfile on a local stand-in for apache/airflow "
        "(debootstrap + pip; no Docker needed; root), pack it with ../shared/node/mkimage.py into out/image/, "
        "optionally load it onto the node. --postgres builds the PostgreSQL image instead.")
    p.add_argument("--target", choices=["kind", "runtime"], default="kind", help="Dockerfile stage (default kind)")
    p.add_argument("--name", default=None,  # of the first image when --with-postgres
                   help=f"image name (default {DEFAULT_NAMES['kind']} for kind, {DEFAULT_NAMES['runtime']} for runtime,"
                   f" {POSTGRES_NAME} with --postgres)")
    p.add_argument("--postgres", action="store_true", help=f"build the PostgreSQL image ({POSTGRES_NAME}) instead")
    p.add_argument("--with-postgres", action="store_true", help="build the PostgreSQL image too (and load both with --load)")
    p.add_argument("--build-arg", action="append", default=[], metavar="K=V", help="like docker build --build-arg")
    p.add_argument("--out", type=Path, default=None, help="output dir (default <repo>/out/image)")
    p.add_argument("--constraints", type=Path, default=None, help="pip constraints for the stand-in (default <repo>/.ci/constraints.txt)")
    p.add_argument("--airflow-version", default=None, help="Airflow of the stand-in (default: the constraints' apache-airflow pin)")
    p.add_argument("--mkimage", type=Path, default=None, help="mkimage.py (default $FENCED_MKIMAGE or ../shared/node/mkimage.py)")
    p.add_argument("--load", action="store_true", help="run ../shared/node/load-image.sh on the tar(s) ($FENCED_LOAD_IMAGE)")
    p.add_argument("--no-pip-cache", action="store_true", help="do not share a pip download cache with the stand-in build")
    p.add_argument("--keep-rootfs", action="store_true", help="keep the built rootfs next to the tar (NAME.rootfs)")
    return p


def constraints_version(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.strip().lower().startswith("apache-airflow=="):
            return line.split("==", 1)[1].strip()
    raise SystemExit(f"{path}: no apache-airflow== pin; pass --airflow-version")


def safe(name: str) -> str:
    return name.rsplit("/", 1)[-1].replace(":", "-")


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    say = lambda m: print(m, flush=True)  # noqa: E731
    if os.geteuid() != 0:
        raise SystemExit("fenced-k8s-repro image needs root (debootstrap, chroot, mount namespaces)")
    if not shutil.which("debootstrap") and shutil.which("apt-get"):  # a fresh Debian machine
        subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], capture_output=True)
        if not shutil.which("debootstrap"):
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], capture_output=True)
    for tool in ("debootstrap", "tar"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found (apt-get install {tool})")
    repo = repo_root()
    out_dir = (a.out or repo / "out" / "image").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    tool = a.mkimage or node_tool(repo, "mkimage.py", "FENCED_MKIMAGE")
    if not tool.exists():
        raise SystemExit(f"mkimage.py not found at {tool} (set FENCED_MKIMAGE or --mkimage)")
    constraints = a.constraints or repo / ".ci" / "constraints.txt"
    version = a.airflow_version or constraints_version(constraints)
    build_args = dict(kv.split("=", 1) for kv in a.build_arg)
    timer = Timer(say)
    t0 = time.monotonic()
    bases = B.Bases(repo, timer, constraints, version,
                    None if a.no_pip_cache else B.cache_dir() / "pip", say)
    jobs = [(True, POSTGRES_NAME)] if a.postgres else [(False, DEFAULT_NAMES[a.target])]
    if a.with_postgres and not a.postgres:
        jobs.append((True, POSTGRES_NAME))
    if a.name:
        jobs[0] = (jobs[0][0], a.name)
    if not all(is_pg for is_pg, _ in jobs):
        with timer("pip wheel --no-deps . -w dist (the wheel the Dockerfile copies)"):
            say(f"[image] {build_wheel(repo, RUNTIME, repo / 'dist')}")
    tars = [_build_one(a, is_pg, name, repo, out_dir, tool, bases, timer, build_args, say) for is_pg, name in jobs]
    say(f"[image] done in {time.monotonic() - t0:.1f}s: " + ", ".join(f"{n} ({t.name})" for (_, n), t in zip(jobs, tars)))
    if a.load:
        loader = node_tool(repo, "load-image.sh", "FENCED_LOAD_IMAGE")
        for tar in tars:
            with timer(f"load {tar.name} onto the node"):
                subprocess.run(["bash", str(loader), str(tar)], check=True)
    for tar in tars:
        print(tar)
    return 0


def _build_one(a, is_pg: bool, name: str, repo: Path, out_dir: Path, tool: Path, bases: B.Bases, timer: Timer,
               build_args: dict, say) -> Path:
    t0 = time.monotonic()
    tar = out_dir / f"{safe(name)}.tar"
    # The PostgreSQL image depends on nothing of this repository: it is cached whole.
    cached = bases.dir / f"{safe(name)}-{bases.postgres_key(name)}.tar" if is_pg and not a.keep_rootfs else None
    if cached is not None and cached.exists():
        shutil.copyfile(cached, tar)
        say(f"[image] cached {name}: {cached} -> {tar}")
        return tar
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".work-") as tmp:
        work = Path(tmp)
        try:
            if is_pg:
                root = work / "postgres"
                bases.postgres_rootfs(root)
                cfg = dict(entrypoint=B.POSTGRES_ENTRYPOINT, cmd=B.POSTGRES_CMD, env=B.POSTGRES_ENV,
                           workdir="/", user="")
            else:
                st = Builder(repo, work, bases, timer, build_args, say).build(repo / "Dockerfile", a.target)
                root = st.root
                B._finish_rootfs(root)
                cfg = dict(entrypoint=st.entrypoint, cmd=st.cmd, env=st.env, workdir=st.workdir, user=st.user)
            with timer(f"mkimage {name}"):
                mkimage(tool, root, name, tar, **cfg)
            if a.keep_rootfs:
                keep = out_dir / f"{safe(name)}.rootfs"
                rmtree(keep)
                root.rename(keep)
        finally:
            for d in work.iterdir():
                rmtree(d)
    if cached is not None:
        shutil.copyfile(tar, cached.with_suffix(".tmp"))
        cached.with_suffix(".tmp").rename(cached)
    say(f"[image] {name} -> {tar} ({tar.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - t0:.1f}s")
    return tar
