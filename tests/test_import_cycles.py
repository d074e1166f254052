"""tfring's modules import each other without cycles.

A cycle hides behind imports moved into functions and breaks when one of
them moves back to the top; it also says that two modules are one concern
split in two. Every import of a tfring module counts, at the top of a file
or inside a function. The graph is read from the sources (ast), so nothing
is imported here.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfring"


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path, modules):
    """The tfring modules `path` imports (a package's import counts for the
    package's __init__; `from pkg import name` counts for pkg.name when
    that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules}


def _cycle(graph):
    """One cycle as a list of module names, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_import_cycles():
    modules = _modules()
    # The package's __init__ loads the API lazily (importlib), so it is no
    # edge here; a module importing `tfring` itself would be one, and is
    # not followed either: it is where every name is re-exported.
    # A module's own parent packages are no edge either: Python runs them
    # before the module in any case (`from tfring.keras import fit_hook`
    # inside tfring.keras.optimizer names the package only to reach a
    # sibling).
    graph = {name: {target for target in _imports(path, modules) - {"tfring", name}
                    if not name.startswith(target + ".")}
             for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
