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


# The front ends over the buffer binding run in processes that must not load
# TensorFlow (importing parts of torch after it crashes some torch releases;
# the MXNet environment has none): neither they nor any tfring module they
# reach imports it, at the top of a file or inside a function.
FRAMEWORK_FREE = ("tfring.torch", "tfring.mxnet", "tfring.common")
TENSORFLOW = ("tensorflow", "keras", "tf_keras")
# Imports of TensorFlow inside a function, on a path the buffer front ends
# never take (module -> why).
GUARDED = {
    "tfring.process_sets": "resolve() raises TensorFlow's error only for TensorFlow's "
                           "collectives; the buffer front ends pass allow_outside=True",
}


def _external_imports(path):
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _reached_from(starts, graph):
    seen, todo = set(), list(starts)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


def test_buffer_front_ends_never_import_tensorflow():
    modules = _modules()
    graph = {name: _imports(path, modules) - {"tfring"} for name, path in modules.items()}
    starts = [name for name in modules if name.startswith(FRAMEWORK_FREE)]
    assert any(n.startswith("tfring.mxnet") for n in starts), starts
    offenders = {name: sorted(_external_imports(modules[name]) & set(TENSORFLOW))
                 for name in _reached_from(starts, graph)}
    offenders = {name: found for name, found in offenders.items()
                 if found and name not in GUARDED}
    assert not offenders, (
        "modules that tfring.torch, tfring.mxnet or tfring.common reach import "
        f"TensorFlow: {offenders}")


def test_torch_collectives_leave_tensorflow_unloaded():
    """At run time too: init, a collective and shutdown load no TensorFlow."""
    import importlib.util
    import subprocess
    import sys
    if importlib.util.find_spec("torch") is None:
        import pytest
        pytest.skip("torch is not installed")
    code = ("import sys, torch, tfring.torch as hvd\n"
            "hvd.init()\n"
            "assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [1.0, 1.0]\n"
            "hvd.shutdown()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras')))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("[]"), result.stdout
