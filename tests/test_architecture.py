"""The house rules, checked on the source: no import cycle between cutedebug's modules
(function-level imports and ``importlib.import_module("cutedebug....")`` included; imports
under ``if TYPE_CHECKING:`` are not run and do not count), imports go one way along the flow
(commands -> reporting -> analyses -> engine -> instrument), and no module is over
MAX_LINES lines.

The allow-lists below are explicit and may only shrink: each entry names the module, its
owner and why it is still there. A module that is now within the rule must leave the list
(the tests fail on stale entries too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "cutedebug"
MAX_LINES = 600

# Modules still over MAX_LINES while their owners split them (issue 21), with the owner.
OVER_LIMIT: dict[str, str] = {}

# The flow, top to bottom: a module may import its own layer and the layers below it. "base"
# holds the modules every layer may use (they import no other cutedebug module).
LAYERS = ("commands", "reporting", "analyses", "engine", "instrument", "base")
# Modules whose layer is not their folder's. The package root is the public facade
# (``cutedebug.checkpoint(...)`` imports the instrument lazily), so it sits on top.
TOP_LEVEL = {
    "cutedebug": "commands",
    "cutedebug.__main__": "commands",
    "cutedebug.pytest_plugin": "commands",
    "cutedebug.kernel_api": "base",
    "cutedebug.errors": "base",
    # the one place records are serialised (dataclasses <-> JSON); imports nothing of ours
    "cutedebug.records": "base",
    # one event of a child's event channel: written by the worker and by exec'd processes
    "cutedebug.event": "base",
    "cutedebug.event_kinds": "base",
    # is there a GPU device node (stdlib only): the fork server, the worker, exec's probes
    "cutedebug.devices": "base",
    # leaf helpers any layer may use to write files and escape text (they import nothing)
    "cutedebug.reporting.escape": "base",
    "cutedebug.reporting.files": "base",
}
# Import cycles still there, with the owner who breaks them (the list may only shrink).
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}
# Edges still against the flow, with the owner who removes them.
AGAINST_FLOW: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """cutedebug modules ``path`` imports, anywhere in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _type_checking_nodes(tree)
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def add(name: str, member: str | None = None) -> None:
        if member and f"{name}.{member}" in known:
            found.add(f"{name}.{member}")
        elif name in known:
            found.add(name)

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                add(base, alias.name)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value)
    found.discard(me)
    return {m for m in found if m.startswith("cutedebug")}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def layer(name: str) -> str:
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    lay = name.split(".")[1]
    assert lay in LAYERS, f"{name}: a new top-level module; give it a layer in TOP_LEVEL"
    return lay


def test_the_import_graph_is_read():
    g = graph()
    # an independent spot check: edges that exist in the source today
    assert "cutedebug.engine.verdict" in g["cutedebug.engine.runner"]
    assert "cutedebug.reporting.stuck_map" in g["cutedebug.reporting.report"]
    assert "cutedebug.instrument.checkpoint" in g["cutedebug"]  # importlib.import_module
    assert len(g) >= 30


def test_cycle_detection_finds_a_function_level_cycle(tmp_path):
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = [c for c in cycles(graph()) if tuple(c) not in KNOWN_CYCLES]
    stale = [c for c in KNOWN_CYCLES if list(c) not in cycles(graph())]
    assert not stale, f"cycles no longer there, remove them from KNOWN_CYCLES: {stale}"
    assert not found, "import cycles (function-level imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_imports_follow_the_flow():
    g = graph()
    bad = []
    for src, targets in g.items():
        for dst in targets:
            ls, ld = layer(src), layer(dst)
            if LAYERS.index(ld) < LAYERS.index(ls) and (src, dst) not in AGAINST_FLOW:
                bad.append(f"{src} ({ls}) imports {dst} ({ld})")
    assert not bad, (
        "imports against the flow " + " -> ".join(LAYERS) + ":\n" + "\n".join(sorted(bad))
    )
    stale = [e for e in AGAINST_FLOW if e[1] not in g.get(e[0], ())]
    assert not stale, f"allowed edges no longer present, remove them: {stale}"


def test_modules_are_at_most_max_lines():
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for p in PKG.rglob("*.py")
    }
    over = {p: n for p, n in sizes.items() if n > MAX_LINES}
    new = {p: n for p, n in over.items() if p not in OVER_LIMIT}
    assert not new, f"modules over {MAX_LINES} lines (split them): {new}"
    stale = sorted(p for p in OVER_LIMIT if sizes.get(p, 0) <= MAX_LINES)
    assert not stale, f"now within {MAX_LINES} lines (or gone), remove from OVER_LIMIT: {stale}"
