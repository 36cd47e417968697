"""The docs agree with the code: option names, defaults and accepted values (``config.OPTIONS`` and
the parser's own messages), the supported and tested versions (``compat``, ``pyproject.toml``, the
CI matrix), the fields stamped on pods (``names``), and the worker's command. Read from README.md
and every docs/*.md (the CHANGELOG too, for version ranges), so a change to the code that the docs
do not follow fails here, and so does a doc that drifts.
"""

from __future__ import annotations

import ast
import re
import sys
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


#: Words of a statement of accepted values that constrain them (issue 54: configuration.md gave
#: deployment_id's characters but not that its ends must be alphanumeric).
_CONSTRAINTS = {"True", "False", "empty", "identifier", "alphanumeric", "ends"}


def _tokens(text: str) -> set[str]:
    """What a statement of accepted values commits to: its numbers, the modes and booleans it names,
    its character classes and the words that constrain the values."""
    words = set(re.findall(r"[A-Za-z]+(?:-[A-Za-z]+)*", text)) & ({m.value for m in config.Mode} | _CONSTRAINTS)
    return set(re.findall(r"\d+", text)) | words | set(re.findall(r"\[[^\]]+\]", text))


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


#: The witness Lease's annotations (``job.<id>.<start>``): on the Lease, never on a pod.
WITNESS = {names.WITNESS_ENTRY_PREFIX[len("fenced-k8s-executor.io/"):].rstrip(".")}


def test_every_stamped_name_the_docs_give_exists():
    given = {(path.name, n) for path in DOCS for n in re.findall(_OURS, _text(path))}
    assert LAB_NAMES and given and {(doc, n) for doc, n in given if n not in STAMPED | LAB_NAMES | WITNESS} == set()


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


# --- metrics: every name the code emits, as plain statsd receives it (issue 54) -----------------------

_EMITTERS = {"incr", "timing", "timed", "decision"}


def _literal(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def emitted_metrics() -> dict[str, set[tuple[tuple[str, ...], tuple[tuple[str, object], ...]]]]:
    """Every ``metrics.incr/timing/timed/decision`` call of the runtime, read from its source:
    metric name -> {(tag keys, the tags' literal values)}. A name or tags the reading cannot see
    (not a literal) fails: the docs could not follow it."""
    found: dict = {}
    for path in sorted((ROOT / "fenced_k8s_executor").rglob("*.py")):
        if path.name == "metrics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _EMITTERS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "metrics"):
                continue
            where, kind, first = f"{path.name}:{node.lineno}", node.func.attr, node.args[0]
            names = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
            assert all(isinstance(n, ast.Constant) for n in names), f"{where}: a metric name that is not a literal"
            keywords = {k.arg: k.value for k in node.keywords}
            if kind == "decision":
                tags = {"path": keywords["path"], "reason": keywords["reason"], "mode": None}
            elif kind == "timed":
                tags = keywords
            else:
                given = node.args[1 if kind == "incr" else 2] if len(node.args) > (1 if kind == "incr" else 2) \
                    else keywords.get("tags")
                if given is None or _literal(given) is None and isinstance(given, ast.Constant):
                    tags = {}
                else:
                    assert isinstance(given, ast.Dict) and all(isinstance(k, ast.Constant) for k in given.keys), \
                        f"{where}: tags that are not a literal dict"
                    tags = {k.value: v for k, v in zip(given.keys, given.values)}
            entry = (tuple(tags), tuple((k, _literal(v)) for k, v in tags.items()))
            for name in names:
                found.setdefault(name.value, set()).add(entry)
    return found


def statsd_pattern(name: str, keys: tuple[str, ...]) -> str:
    """The name plain statsd receives, each tag value as ``<key>``, in ``metrics.named``'s order."""
    from fenced_k8s_executor import metrics

    values = {key: f"V{i}" for i, key in enumerate(keys)}
    text = metrics.named(f"{names.METRIC_PREFIX}.{name}", values)
    for key, value in values.items():
        text = text.replace(f".{value}", f".<{key}>")
    return text


def _metric_rows() -> dict[str, dict[str, str]]:
    (table,) = [t for t in _tables(_text(ROOT / "docs" / "operations.md")) if t[0][:3] == ["metric", "type",
                                                                                            "on plain statsd (the prefix left out)"]]
    head = [h.split(" (")[0] for h in table[0]]
    return {_plain(row[0]): dict(zip(head, row)) for row in table[1:]}


def test_every_metric_the_code_emits_is_documented_with_its_plain_statsd_names():
    emitted, rows = emitted_metrics(), _metric_rows()
    assert len(emitted) > 20
    assert set(rows) == {f"{names.METRIC_PREFIX}.{name}" for name in emitted}, "operations.md's metrics table"
    wrong = []
    for name, uses in emitted.items():
        row = rows[f"{names.METRIC_PREFIX}.{name}"]
        wire = set(re.findall(r"`([^`]+)`", row["on plain statsd"]))
        expected = {statsd_pattern(name, keys) for keys, _ in uses}
        if wire != expected:
            wrong.append((name, sorted(wire), sorted(expected)))
        tags = {key for keys, _ in uses for key in keys}
        if set(re.findall(r"[a-z_]+", row["tags"].split("(")[0] if "(" not in row["tags"] else
                          re.sub(r"\([^)]*\)", "", row["tags"]))) != tags:
            wrong.append((name, row["tags"], sorted(tags)))
        literals = {value for _, pairs in uses for key, value in pairs if isinstance(value, str) and key != "mode"}
        missing = {v for v in literals if v not in row["tags"] + row["meaning"]}
        if missing:
            wrong.append((name, "values not named", sorted(missing)))
    assert wrong == []


def test_every_alert_is_written_against_a_name_plain_statsd_receives():
    section = _text(ROOT / "docs" / "operations.md").split("## Suggested alerts", 1)[1].split("\n## ", 1)[0]
    (table,) = _tables(section)
    patterns = [re.escape(statsd_pattern(name, keys)).replace(r"<", "<").replace(r">", ">")
                for name, uses in emitted_metrics().items() for keys, _ in uses]
    wire = [re.compile(re.sub(r"<[a-z_]+>", r"[^.]+", p) + r"\Z") for p in patterns]
    used = [n for row in table[1:] for n in re.findall(r"`(fenced_k8s_executor\.[^`]+)`", row[1])]
    assert len(used) >= 8
    unknown = [n for n in used if not any(w.match(n.replace("*", "x")) for w in wire)]
    assert unknown == []


# --- the CLI's commands ---------------------------------------------------------------------------------

def test_every_cli_command_the_docs_give_exists_and_each_is_documented():
    from fenced_k8s_executor import cli

    (group,) = cli.commands()
    commands = {c.name: {flag for arg in c.args for flag in arg.flags} for c in group.subcommands}
    given = {(path.name, m) for path in DOCS + [ROOT / "CHANGELOG.md"]
             for m in re.findall(r"airflow fenced-k8s ([a-z][a-z-]*)", _text(path))}
    assert {(doc, c) for doc, c in given if c not in commands} == set()
    assert set(commands) <= {c for _, c in given}, "a command no doc mentions"
    flags = {(path.name, c, f) for path in DOCS for c, f in re.findall(r"airflow fenced-k8s ([a-z-]+)((?: --?[a-z-]+)+)",
                                                                     _text(path))}
    unknown = {(doc, c, flag) for doc, c, fs in flags for flag in fs.split() if flag not in commands.get(c, ())}
    assert unknown == set()


def test_operations_names_every_standing_the_pods_command_prints():
    """The standings list under ``airflow fenced-k8s pods`` is ``cli.STANDINGS``, no more, no less
    (it had lost four of them, ``launched by another database`` among them)."""
    from fenced_k8s_executor import cli

    text = _text(ROOT / "docs" / "operations.md")
    listed = text.split("Standings, and what enforce does to each:", 1)[1].split("\n\n   Finished pods", 1)[0]
    assert re.findall(r"^   - \*\*([^*]+)\*\*", listed, re.M) == list(cli.STANDINGS)


# --- counts and tables that go stale ----------------------------------------------------------------------

def test_no_doc_states_a_unit_test_count():
    """The count changes with every commit; the docs say what the unit tests cover instead."""
    stated = [(path.name, m) for path in DOCS for m in re.findall(r"\b\d[\d,]* unit tests\b", _text(path))]
    assert stated == []


def test_the_matrix_table_is_the_one_its_results_file_prints():
    """docs/testing.md's matrix table is ``.ci/matrix --markdown`` of the run it names (kept in
    docs/matrix-results.json): no count in it is edited by hand, and the unit suite's is left out."""
    import importlib.machinery
    import importlib.util
    import json

    loader = importlib.machinery.SourceFileLoader("ci_matrix", str(ROOT / ".ci" / "matrix"))
    spec = importlib.util.spec_from_loader("ci_matrix", loader)
    matrix = importlib.util.module_from_spec(spec)
    sys.modules["ci_matrix"] = matrix  # its dataclasses look their module up
    try:
        loader.exec_module(matrix)
    finally:
        del sys.modules["ci_matrix"]
    printed = matrix.markdown(json.loads((ROOT / "docs" / "matrix-results.json").read_text()))
    assert printed in _text(ROOT / "docs" / "testing.md")


def test_the_readme_results_table_has_the_columns_the_command_prints():
    """The README pastes ``fenced-k8s-repro``'s headline (``report.summary``): same columns."""
    from fenced_k8s_lab import report

    printed_header = report.summary({}).splitlines()[0]
    (table,) = [t for t in _tables(_text(ROOT / "README.md")) if t[0][:2] == ["scenario", "executor"]]
    assert "| " + " | ".join(table[0]) + " |" == printed_header
    assert all(len(row) == len(table[0]) for row in table)
