"""The Dockerfile interpreter's parsing, variable expansion and .dockerignore matching (fast; no
root, no build). The build itself is in test_image.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from fenced_k8s_lab.image.build import Builder
from fenced_k8s_lab.image.chroot import Timer
from fenced_k8s_lab.image.dockerfile import DockerIgnore, Unsupported, copy_context, expand, parse

REPO = Path(__file__).resolve().parents[2]


def test_parses_the_repos_dockerfile():
    instrs = parse((REPO / "Dockerfile").read_text())
    cmds = [i.cmd for i in instrs]
    assert set(cmds) <= {"ARG", "FROM", "USER", "COPY", "RUN"}
    froms = [i.args for i in instrs if i.cmd == "FROM"]
    assert froms == ["apache/airflow:3.3.2-python3.11 AS runtime", "runtime AS kind"]
    heredocs = {i.args.split()[-1]: i.heredoc for i in instrs if i.heredoc is not None}
    assert set(heredocs) == {"/opt/airflow/dags/fenced_repro.py", "/opt/airflow/dags/fenced_smoke.py"}
    smoke = heredocs["/opt/airflow/dags/fenced_smoke.py"]
    assert 'dag_id="fenced_smoke"' in smoke and smoke.endswith("fenced_smoke()\n")
    compile(smoke, "fenced_smoke.py", "exec")
    compile(heredocs["/opt/airflow/dags/fenced_repro.py"], "fenced_repro.py", "exec")
    pip, check = [i.args for i in instrs if i.cmd == "RUN"]  # the recipe: tests/image/test_install_recipe.py
    assert pip.startswith("pip install") and "\\" not in pip and pip.endswith("--constraint /tmp/constraints.txt")
    assert 'fenced_k8s_executor.FencedKubernetesExecutor" && rm /tmp/' in check  # no build leftovers


def test_continuations_comments_and_heredoc_delimiters():
    text = "# syntax=docker/dockerfile:1.7\nFROM a AS b\nRUN echo 1 \\\n# dropped\n    && echo 2\n" \
           "COPY <<'EOF' /x\n# kept\nline\nEOF\nUSER u\n"
    ins = parse(text)
    assert [(i.cmd, i.args) for i in ins] == [("FROM", "a AS b"), ("RUN", "echo 1 && echo 2"),
                                               ("COPY", "- /x"), ("USER", "u")]
    assert ins[2].heredoc == "# kept\nline\n"
    with pytest.raises(Unsupported, match="unquoted heredoc"):
        parse("COPY <<EOF /x\n$HOME\nEOF\n")
    with pytest.raises(Unsupported, match="never ends"):
        parse("COPY <<'EOF' /x\nno end\n")


def test_expand():
    assert expand("apache/airflow:${TAG}", {"TAG": "3.3.2"}) == "apache/airflow:3.3.2"
    assert expand("$A-${B:-dflt}", {"A": "x"}) == "x-dflt"
    with pytest.raises(Unsupported):
        expand("${TAG%%-*}", {"TAG": "3.3.2"})


@pytest.mark.parametrize("instruction", ["ENV A=1", "WORKDIR /x", "ADD a /b", "ENTRYPOINT [\"x\"]",
                                         "CMD x", "RUN [\"x\"]", "RUN --mount=type=cache,target=/x true",
                                         "COPY --from=runtime /a /b", "COPY --chmod=755 a /b"])
def test_anything_else_fails_loudly(tmp_path, instruction):
    from fenced_k8s_lab.image.build import Stage

    b = Builder(tmp_path, tmp_path, bases=None, timer=Timer(lambda m: None), build_args={})
    st = Stage("s", tmp_path, {}, "root", "/", [], [])
    (ins,) = parse(instruction + "\n")
    with pytest.raises(Unsupported, match=r"line 1"):
        b._step(st, ins, {})


def test_only_arg_before_from_and_known_bases(tmp_path):
    df = tmp_path / "Dockerfile"
    b = Builder(tmp_path, tmp_path, bases=None, timer=Timer(lambda m: None), build_args={})
    df.write_text("ENV A=1\nFROM apache/airflow:3.3.2 AS runtime\n")
    with pytest.raises(Unsupported, match="only ARG"):
        b.build(df, "runtime")
    df.write_text("FROM python:3.12 AS runtime\n")
    with pytest.raises(Unsupported, match="stand-in"):
        b.build(df, "runtime")


def test_dockerignore_matches_like_docker():
    ig = DockerIgnore((REPO / ".dockerignore").read_text())
    for path in (".git/config", ".venv/bin/python", "fenced_k8s_executor/__pycache__/x.pyc",
                 "lab/fenced_k8s_lab/image/build.py", "fenced_k8s_executor.egg-info/PKG-INFO", "out/image/a.tar",
                 "tests/unit/test_x.py", "docs/index.md", "Dockerfile", ".dockerignore", ".lab-cache/x"):
        assert ig.excluded(path), path
    for path in ("pyproject.toml", "README.md", "fenced_k8s_executor/executor.py",
                 "fenced_k8s_executor/tests/x.py", "dist/fenced_k8s_executor-0.2.0-py3-none-any.whl",
                 ".ci/constraints.txt"):  # the last two: what the runtime stage copies
        assert not ig.excluded(path), path
    neg = DockerIgnore("*.md\n!README.md\ndocs/**/*.png\n")
    assert neg.excluded("NOTES.md") and not neg.excluded("README.md") and not neg.excluded("sub/NOTES.md")
    assert neg.excluded("docs/a/b/c.png") and neg.excluded("docs/c.png") and not neg.excluded("docs/c.svg")


def test_copy_context_honours_dockerignore(tmp_path):
    ctx, dst = tmp_path / "ctx", tmp_path / "root" / "tmp" / "pkg"
    for rel in ("pyproject.toml", "pkg/mod.py", "pkg/__pycache__/mod.pyc", "docs/x.md", "pkg/sub/data.txt"):
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text(rel)
    ig = DockerIgnore("**/__pycache__\ndocs\n")
    assert copy_context(ctx, ig, ["."], dst, True, 0, 0) == 3
    got = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    assert got == ["pkg/mod.py", "pkg/sub/data.txt", "pyproject.toml"]
