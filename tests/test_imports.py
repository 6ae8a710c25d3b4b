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
# Modules that run a command line: nothing below them may import them.
COMMANDS = {
    "logstream.cli", "logstream.__main__", "logstream.alerts.cli", "logstream.alerts.__main__",
    "logstream.lifecycle.feedback_cli", "logstream.lifecycle.models_cli", "logstream.memory.cli",
}  # fmt: skip
# The commands' work (training, backtests, serving, benchmarks): the core that scores records
# must not depend on it.
WORK = {"logstream.lifecycle.train", "logstream.replay", "logstream.serve", "logstream.tail"}
CORE = {
    "logstream.records", "logstream.consumers.inputs", "logstream.detector", "logstream.engine.streaming",
    "logstream.scoring.scorer", "logstream.scoring.calibration", "logstream.scoring.gpd",
    "logstream.scoring.levels", "logstream.scoring.evidence", "logstream.scoring.config", "logstream.text.normalize", "logstream.text.patterns", "logstream.engine.tokenizer",
    "logstream.engine.model", "logstream.lifecycle.metadata", "logstream.text.event_time", "logstream.text.explain",
    "logstream.consumers.parse", "logstream.consumers.file", "logstream.alerts.context",
}  # fmt: skip


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


def test_nothing_imports_a_command_module() -> None:
    """Only command modules import command modules (cli, alerts.cli, the __main__s)."""
    bad = [(m, d) for m, deps in graph().items() if m not in COMMANDS for d in deps & COMMANDS]
    assert bad == []


def test_the_core_does_not_import_the_commands_work() -> None:
    """Records, inputs, the detector and what it is built from import no training, replay,
    serving or benchmark module (e.g. `inputs` takes `Stream` from records, not train)."""
    edges = graph()
    bad = [(m, d) for m in sorted(CORE) for d in sorted(edges[m] & WORK)]
    assert bad == []


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
