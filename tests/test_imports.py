"""The import graph of the package, read from the source (ast; nothing is imported): imports
run one way, so a core module can be read, tested and reused without the commands above it.

Every import counts, also those inside functions (a lazy import is still a dependency);
those under `if TYPE_CHECKING:` do not (annotations only).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = tuple(
    ".".join(p.parent.relative_to(ROOT).parts)
    for p in sorted(ROOT.joinpath("logstream").rglob("__init__.py"))
)
# The layers, lowest first: a module imports modules of its own layer or below, never above.
# A name is a module, or a package with `.*` (every module in it); the most specific name wins.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("logstream", "logstream.errors", "logstream.records", "logstream.regex",
                     "logstream.rotating", "logstream.metrics")),
    ("log text", ("logstream.text.*",)),
    ("configuration", ("logstream.alerts.config", "logstream.alerts.matchers", "logstream.memory.settings",
                       "logstream.settings")),
    ("scoring", ("logstream.scoring.*",)),
    ("model engine", ("logstream.engine.*",)),
    ("detector", ("logstream.detector",)),
    ("sources", ("logstream.consumers.*",)),
    ("verdicts", ("logstream.lifecycle.feedback",)),
    ("alerts and incident memory", ("logstream.alerts.*", "logstream.memory.*")),
    ("assembly: the alert pipeline, the model lifecycle, evaluation",
     ("logstream.alerts.pipeline", "logstream.lifecycle.*", "logstream.evaluation.*", "logstream.report.groups")),
    ("drivers", ("logstream.replay", "logstream.tail", "logstream.serve", "logstream.serve_check", "logstream.audit",
                 "logstream.kafka_state", "logstream.http_api", "logstream.demo", "logstream.report.*")),
    ("commands", ("logstream.cli", "logstream.__main__", "logstream.alerts.cli", "logstream.alerts.__main__",
                  "logstream.lifecycle.feedback_cli", "logstream.lifecycle.models_cli", "logstream.memory.cli")),
]  # fmt: skip


def layer_of(module: str) -> int:
    """The layer of `module`: an exact name, else the longest package with `.*` holding it."""
    best, length = -1, -1
    for number, (_, names) in enumerate(LAYERS):
        for name in names:
            if name == module:
                return number
            package = name.removesuffix(".*")
            inside = module == package or module.startswith(package + ".")  # the package's __init__ too
            if name.endswith(".*") and inside and len(package) > length:
                best, length = number, len(package)
    return best


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted(ROOT.joinpath(*package.split(".")).glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports (`from a import b` counts a.b if it is a module)."""
    package = name if path.stem == "__init__" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package (one level per extra dot)
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), i.e. the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_the_graph_is_read() -> None:
    """The reader finds known edges, into the subpackages too (else the checks below would pass
    on an empty graph)."""
    edges = graph()
    assert "logstream.records" in edges["logstream.detector"]
    assert "logstream.consumers.parse" in edges["logstream.tail"]
    assert "logstream.alerts.cli" in edges["logstream.cli"]


def test_the_repository_root_shadows_no_installed_package() -> None:
    """Commands run in a checkout have its root on sys.path, and a package there wins over an
    installed one of the same name. `logstream` is the root's only package and it has no
    modules: a `kernels/` folder there broke every import of transformers >= 5.25 (which
    imports HuggingFace's `kernels`). Folders without `__init__.py` (benchmarks/) lose to
    installed packages, so they may stay."""
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    modules = sorted(p.name for p in ROOT.glob("*.py"))
    assert (packages, modules) == (["logstream"], [])


def test_cycles_are_found() -> None:
    """The cycle finder reports a cycle, and only the modules on it."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    """No module imports, even lazily, a module that imports it back."""
    assert cycles(graph()) == []


def test_every_module_has_a_layer() -> None:
    """Each module of the package is placed in a layer (a new module must be placed)."""
    assert [m for m in modules() if layer_of(m) < 0] == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    """Imports run down the layers: foundations, log text, configuration, scoring, the model
    engine, the detector, sources, verdicts, alerts and memory, the assembled pipeline and
    lifecycle, the drivers (replay, tail, serve), the commands."""
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in graph().items()
        for d in sorted(deps)
        if layer_of(d) > layer_of(m)
    ]
    assert upward == []


LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "msg"}
EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def log_events(path: Path) -> list[tuple[int, str]]:
    """(line, event) of each structlog call with a literal event: `log.<level>("event", ...)`
    on a module's `log = structlog.get_logger(...)` or on a logger bound from it (`log.bind(...)`,
    assigned or chained)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    loggers = {"log"}
    for node in ast.walk(tree):  # names assigned from structlog.get_logger or a logger's .bind/.new
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            called = ast.unparse(node.value.func)
            bound = called.split(".")[0] in loggers and called.endswith((".bind", ".new"))
            if called == "structlog.get_logger" or bound:
                loggers |= {ast.unparse(t) for t in node.targets}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LOG_METHODS
            and _root(node.func.value) in loggers
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _root(node: ast.expr) -> str:
    """The name a chain of attributes and calls starts from: `log` for `log.bind(a=1)`."""
    while isinstance(node, ast.Attribute | ast.Call):
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return ast.unparse(node)


def test_log_events_are_snake_case_names() -> None:
    """One structlog style: the event is a short snake_case name (`changelog_write_failed`), and
    what happened goes in key-value fields, never a sentence in the event."""
    events = {f"{name}:{line}": event for name, path in modules().items() for line, event in log_events(path)}
    assert len(events) > 20  # the scan finds the package's log calls
    assert {where: event for where, event in events.items() if not EVENT_NAME.match(event)} == {}
