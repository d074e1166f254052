"""The error messages tfring raises, read from its sources.

Why: docs/troubleshooting.md explains every error tfring raises. Each error
there has a key phrase, a piece of the message's fixed text; this module
finds every raised message so tests/test_docs.py can check that each one
contains a key phrase of the page, and that each phrase still matches one.

What counts as a raised message:
  * Python (tfring/**/*.py): `raise SomeError(<message>)`,
    `return SomeError(<message>)` (a function that builds the error its
    callers raise) and `parser.error(<message>)`, where <message> is a string literal, an
    f-string or a concatenation of them; a placeholder becomes `{}`;
  * C++ (cc/**/*.cc, tfring/**/*.cc): `Status::<Code>(...)` (except OK),
    `errors::<Code>(...)` and `throw ...(...)`: the string literals inside
    the call, joined, a non-literal piece becoming `{}`.
A message with no literal text at all (one passed on from elsewhere, such
as a Status returned by a callee) is not a new error and is skipped.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python_text(node):
    """The fixed text of a message expression, or None when it has none."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}"
                       for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left, right = _python_text(node.left), _python_text(node.right)
        if left is None and right is None:
            return None
        if isinstance(node.op, ast.Mod):
            return left
        return (left or "{}") + (right or "{}")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"):
        return _python_text(node.func.value)
    return None


def _names_an_exception(func):
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name.endswith(("Error", "Exception"))


def _python_messages(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        call = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            call = node.exc
        elif (isinstance(node, ast.Return) and isinstance(node.value, ast.Call)
              and _names_an_exception(node.value.func)):
            call = node.value
        elif (isinstance(node, ast.Call)
              and isinstance(node.func, ast.Attribute)
              and node.func.attr == "error"
              and isinstance(node.func.value, ast.Name)
              and node.func.value.id == "parser"):
            call = node
        if call is None or not call.args:
            continue
        text = _python_text(call.args[0])
        if text and any(c.isalpha() for c in text.replace("{}", "")):
            yield call.lineno, text


_CPP_CALL = re.compile(
    r"\b(?:Status::(?!OK\b)[A-Z]\w*|errors::[A-Z]\w*|throw\s+[\w:]+)\s*\(")
_CPP_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _cpp_messages(path):
    source = path.read_text()
    for match in _CPP_CALL.finditer(source):
        depth, end = 1, match.end()
        while depth and end < len(source):
            char = source[end]
            if char == '"':
                end = _CPP_STRING.match(source, end).end()
                continue
            depth += {"(": 1, ")": -1}.get(char, 0)
            end += 1
        inside = source[match.end():end - 1]
        pieces = _CPP_STRING.findall(inside)
        if not pieces:
            continue
        # Adjacent literals are one string; anything else between them is a
        # value spliced in.
        parts = _CPP_STRING.split(inside)  # code, literal, code, literal, ...
        text = "".join(part if i % 2 else ("{}" if part.strip() else "")
                       for i, part in enumerate(parts))
        text = re.sub(r"(\{\})+", "{}", text)
        if text.strip("{} "):
            yield source.count("\n", 0, match.start()) + 1, text


def raised_messages():
    """[(path relative to the repository, line, fixed text)] of every error."""
    found = []
    for path in sorted((ROOT / "tfring").rglob("*.py")):
        found += [(path.relative_to(ROOT), line, text)
                  for line, text in _python_messages(path)]
    for folder in ("cc", "tfring"):
        for path in sorted((ROOT / folder).rglob("*.cc")):
            found += [(path.relative_to(ROOT), line, text)
                      for line, text in _cpp_messages(path)]
    return found
