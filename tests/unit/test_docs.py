"""The docs agree with the code: option names, defaults and accepted values (``config.OPTIONS`` and
the parser's own messages), the supported and tested versions (``compat``, ``pyproject.toml``, the
CI matrix), the fields stamped on pods (``names``), and the worker's command. Read from README.md
and every docs/*.md (the CHANGELOG too, for version ranges), so a change to the code that the docs
do not follow fails here, and so does a doc that drifts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fenced_k8s_executor import compat, config, names, worker

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
tomllib = pytest.importorskip("tomllib")


def _text(path: Path) -> str:
    return path.read_text()


def _tables(text: str) -> list[list[list[str]]]:
    """Markdown tables as rows of cells (the separator row dropped)."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _plain(cell: str) -> str:
    return cell.replace("`", "").strip()


def _option_tables() -> list[tuple[str, list[str], list[list[str]]]]:
    found = []
    for path in DOCS:
        for header, *rows in _tables(_text(path)):
            head = [_plain(c).lower() for c in header]
            if head[0] == "option" and "default" in head:
                found.append((path.name, head, rows))
    return found


def test_the_option_tables_are_found():
    assert {name for name, _, _ in _option_tables()} >= {"configuration.md", "helm.md"}


@pytest.mark.parametrize("doc, head, rows", _option_tables(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_option_table_lists_every_option_with_its_default(doc, head, rows):
    listed = {_plain(row[0]): _plain(row[head.index("default")]) for row in rows}
    assert len(listed) == len(rows) and set(listed) == set(config.OPTIONS), doc
    for name, (default, _) in config.OPTIONS.items():
        assert listed[name] == (default or "empty"), (doc, name)


def _accepted(option: str) -> str:
    """What the parser says it accepts for ``option`` (its own error message)."""
    with pytest.raises(config.FencedConfigError) as refused:
        config.parse({option: "\x00not a value"})
    return str(refused.value).split("accepted values: ", 1)[1]


def _tokens(text: str) -> set[str]:
    """What a statement of accepted values commits to: its numbers, the modes and booleans it names."""
    words = set(re.findall(r"[A-Za-z]+", text)) & ({m.value for m in config.Mode} | {"True", "False"})
    return set(re.findall(r"\d+", text)) | words


@pytest.mark.parametrize("doc, head, rows", [t for t in _option_tables() if "accepted" in t[1]],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_the_accepted_values_are_the_parsers(doc, head, rows):
    for row in rows:
        option = _plain(row[0])
        assert _tokens(row[head.index("accepted")]) == _tokens(_accepted(option)), (doc, option, _accepted(option))


def test_every_option_the_docs_name_exists():
    patterns = (r"`\[fenced_kubernetes_executor\] ([a-z_]+)", r"config\.fenced_kubernetes_executor\.([a-z_]+)",
                r"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__([A-Z][A-Z_]*[A-Z])\b")
    named = {(path.name, m.lower()) for path in DOCS for p in patterns for m in re.findall(p, _text(path))}
    assert named and {(doc, n) for doc, n in named if n not in config.OPTIONS} == set()


def test_the_refusals_quoted_in_configuration_md_are_the_codes():
    section = " ".join(_text(ROOT / "docs" / "configuration.md").split("### Names that miss the section", 1)[1].split())
    quoted = [q.removesuffix("...").strip() for q in re.findall(r"`([^`]*did you mean[^`]*)`", section)]
    problems = (config.unknown_options(["modes"]) + config.misnamed_variables(["AIRFLOW__FENCED_KUBERNETES__MODE"])
                + config.misnamed_sections(["fenced_kubernetes"]))
    assert len(quoted) == 3 and all(any(q in p for p in problems) for q in quoted), (quoted, problems)


# --- versions ---------------------------------------------------------------------------------------

def _span(spec: str) -> tuple[str, str]:
    """(first release, last minor line) of a ``>=a.b.c,<x.y`` range: ('3.2.2', '3.4')."""
    bounds = {s.split("=")[-1].lstrip("<>"): s for s in spec.split(",")}
    floor = next(v for v, s in bounds.items() if s.startswith(">="))
    major, minor = next(v for v, s in bounds.items() if s.startswith("<") and "=" not in s).split(".")
    return floor, f"{major}.{int(minor) - 1}"


def test_pyproject_declares_the_supported_ranges():
    project = tomllib.loads(_text(ROOT / "pyproject.toml"))["project"]
    assert f"apache-airflow{compat.SUPPORTED_AIRFLOW}" in project["dependencies"]
    assert f"apache-airflow-providers-cncf-kubernetes{compat.SUPPORTED_PROVIDER}" in project["dependencies"]


def test_every_version_range_in_the_docs_is_the_supported_one():
    last = dict([_span(compat.SUPPORTED_AIRFLOW), _span(compat.SUPPORTED_PROVIDER)])
    python = re.fullmatch(r">=(3\.\d+),<3\.(\d+)", tomllib.loads(_text(ROOT / "pyproject.toml"))["project"]
                          ["requires-python"])
    pythons = f"{python.group(1)}-3.{int(python.group(2)) - 1}"
    wrong = []
    for path in [*DOCS, ROOT / "CHANGELOG.md"]:
        text = " ".join(_text(path).split())
        for low, high in re.findall(r"\b(\d+\.\d+\.\d+) ?(?:-|to) ?(\d+\.\d+)\.x\b", text):
            if low in last and high != last[low]:
                wrong.append((path.name, f"{low}-{high}.x", f"{low}-{last[low]}.x"))
        wrong += [(path.name, f"Python {r}", pythons) for r in re.findall(r"Python (3\.\d+-3\.\d+)", text)
                  if r != pythons]
    assert wrong == []


def test_every_tested_on_is_a_tested_release():
    tested = set(compat.TESTED_AIRFLOW) | set(compat.TESTED_PROVIDER)
    said = {(path.name, v) for path in DOCS for v in re.findall(r"tested on \**(\d+\.\d+\.\d+\w*)", _text(path))}
    assert said and {(doc, v) for doc, v in said if v not in tested} == set()


def test_the_matrix_table_covers_the_tested_releases():
    (table,) = [t for t in _tables(_text(ROOT / "docs" / "testing.md")) if t[0][:2] == ["Airflow", "cncf-kubernetes"]]
    rows = {(row[0], row[1]) for row in table[1:]} | {("3.3.2", "10.25.0")}  # the default run's combination
    assert {a for a, _ in rows} == set(compat.TESTED_AIRFLOW)
    assert {p for _, p in rows} == set(compat.TESTED_PROVIDER)


# --- what is stamped on pods, and how pods start ------------------------------------------------------

STAMPED = {value[len("fenced-k8s-executor.io/"):] for key, value in vars(names).items()
           if key.endswith(("_ANNOTATION", "_LABEL"))}
#: The prefix's names the lab itself uses on its nodes (a taint, a node label): never on a worker pod.
LAB_NAMES = {n for path in (ROOT / "lab").rglob("*.py") for n in re.findall(r'"fenced-k8s-executor\.io/([a-z-]+)"',
                                                                              path.read_text())}
_OURS = r"(?<![\w.])fenced-k8s-executor\.io/([a-z][a-z-]*)"


def _prose(text: str) -> str:
    """The text without its fenced code blocks (whose backticks would pair with the prose's)."""
    return re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)


def _stamped_in(text: str) -> set[str]:
    spans = re.findall(r"`([^`]+)`", text)
    return {s.split("/")[-1] for s in spans if s.split("/")[-1] in STAMPED and (s.count("/") == 0 or
                                                                              s.split("/")[0] in ("fenced-k8s-executor.io", "..."))}


def test_every_stamped_name_the_docs_give_exists():
    given = {(path.name, n) for path in DOCS for n in re.findall(_OURS, _text(path))}
    assert LAB_NAMES and given and {(doc, n) for doc, n in given if n not in STAMPED | LAB_NAMES} == set()


def test_every_list_of_stamped_fields_is_complete():
    """A paragraph naming four or more of them is a list of what is stamped: it names them all
    (``names`` gains a field: each such list says so)."""
    lists = [(path.name, para) for path in DOCS for para in re.split(r"\n\s*\n", _prose(_text(path)))
             if len(_stamped_in(para)) >= 4]
    assert {doc for doc, _ in lists} >= {"README.md", "helm.md", "design.md"}
    assert [(doc, sorted(STAMPED - _stamped_in(para))) for doc, para in lists if STAMPED - _stamped_in(para)] == []


def test_no_doc_starts_the_worker_another_way():
    class Workload:
        def model_dump_json(self) -> str:
            return "{}"

    assert worker.command_args(Workload())[:2] == ["python", "-c"]  # a bootstrap, not `python -m`
    assert "python -c" in _text(ROOT / "README.md")
    assert [path.name for path in DOCS if "python -m fenced_k8s_executor.worker" in _text(path)] == []
