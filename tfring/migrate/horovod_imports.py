# Horovod imports -> tfring imports, and the module paths that use them.
#
# horovod.tensorflow -> tfring; horovod.tensorflow.keras and horovod.keras
# -> tfring.keras (their callbacks under tfring.keras.callbacks);
# horovod.torch -> tfring.torch (whose submodules keep horovod.torch's
# names: mpi_ops, functions, optimizer, compression, ...); horovod.mxnet ->
# tfring.mxnet (mpi_ops, compression, functions likewise). A plain
# `import horovod` is only there for horovod.run(fn, np=N), the in-process
# launcher: tfring is launched from outside (tfringrun -np N), so the call
# becomes fn(*args, **kwargs) and the import goes. Imports of Horovod parts
# tfring does not have (spark, ray, horovod.tensorflow.data) are
# left as they are and reported by findings.py.

from tfring.migrate._libcst import cst, m
from tfring.migrate.findings import dotted_name, unsupported_feature

# Longest prefix first.
MODULE_MAP = (
    ("horovod.tensorflow.keras", "tfring.keras"),
    ("horovod.keras", "tfring.keras"),
    ("horovod.tensorflow", "tfring"),
    ("horovod.torch", "tfring.torch"),
    ("horovod.mxnet", "tfring.mxnet"),
)


def port_module_path(path):
    """The tfring module for a Horovod module path, or None (also for the
    parts tfring does not have, which findings.py reports)."""
    if unsupported_feature(path) is not None:
        return None
    for old, new in MODULE_MAP:
        if path == old or path.startswith(old + "."):
            return new + path[len(old):]
    return None


def _name_node(path):
    node = None
    for part in path.split("."):
        node = cst.Name(part) if node is None else cst.Attribute(node, cst.Name(part))
    return node


def horovod_aliases(module):
    """Names bound to Horovod by the script's imports, with what each is:
    {"hvd": "horovod.torch"} for `import horovod.torch as hvd`,
    {"horovod": "horovod"} for `import horovod.torch`."""
    aliases = {}

    class Finder(cst.CSTVisitor):
        def visit_Import(self, node):
            for alias in node.names:
                path = dotted_name(alias.name) or ""
                if path.split(".")[0] == "horovod":
                    if alias.asname:
                        aliases[alias.asname.name.value] = path
                    else:
                        aliases["horovod"] = "horovod"

        def visit_ImportFrom(self, node):
            path = dotted_name(node.module) if node.module else ""
            if (path or "").split(".")[0] == "horovod" and not isinstance(
                    node.names, cst.ImportStar):
                for alias in node.names:
                    name = alias.asname.name if alias.asname else alias.name
                    aliases[name.value] = f"{path}.{alias.name.value}"

    module.visit(Finder())
    return aliases


class HorovodImports(cst.CSTTransformer):
    """Rewrites the imports, `horovod.tensorflow.x` attribute chains (when
    imported without an alias) and horovod.run(...) calls."""

    def __init__(self):
        super().__init__()
        self.plain_horovod_import = False
        # The blank lines and comments above a removed `import horovod` line
        # go to the next statement of the same block (depth = how many
        # indented blocks enclose it).
        self._depth = 0
        self._orphaned_lines = None  # (depth, [EmptyLine])

    def visit_IndentedBlock(self, node):
        self._depth += 1

    def leave_IndentedBlock(self, original, updated):
        if self._orphaned_lines and self._orphaned_lines[0] == self._depth:
            self._orphaned_lines = None  # the removed line ended the block
        self._depth -= 1
        return updated

    def on_leave(self, original, updated):
        result = super().on_leave(original, updated)
        if not isinstance(original, (cst.SimpleStatementLine,
                                     cst.BaseCompoundStatement)):
            return result
        if isinstance(result, cst.SimpleStatementLine) and not result.body:
            # Its only statement was `import horovod`.
            kept = self._orphaned_lines[1] if self._orphaned_lines else []
            self._orphaned_lines = (self._depth, kept + list(original.leading_lines))
            return cst.RemovalSentinel.REMOVE
        if (self._orphaned_lines and self._orphaned_lines[0] == self._depth
                and isinstance(result, cst.CSTNode)):
            result = result.with_changes(leading_lines=[
                *self._orphaned_lines[1], *result.leading_lines])
            self._orphaned_lines = None
        return result

    def leave_Import(self, original, updated):
        names = []
        for alias in updated.names:
            path = dotted_name(alias.name) or ""
            if path == "horovod":
                self.plain_horovod_import = True
                continue  # only horovod.run needed it
            ported = port_module_path(path)
            names.append(alias.with_changes(name=_name_node(ported))
                         if ported else alias)
        if not names:
            return cst.RemovalSentinel.REMOVE
        names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=names)

    def leave_ImportFrom(self, original, updated):
        if updated.module is None or updated.relative:
            return updated
        path = dotted_name(updated.module) or ""
        if path == "horovod" and not isinstance(updated.names, cst.ImportStar):
            # `from horovod import tensorflow as hvd`
            kept = []
            for alias in updated.names:
                ported = port_module_path(f"horovod.{alias.name.value}")
                if ported is None:
                    kept.append(alias)
                    continue
                asname = alias.asname or cst.AsName(name=cst.Name(alias.name.value))
                return cst.Import(names=[cst.ImportAlias(
                    name=_name_node(ported), asname=asname)])
            return updated.with_changes(names=kept)
        # leave_Attribute has ported the module path already.
        original_path = dotted_name(original.module) or ""
        if not isinstance(updated.names, cst.ImportStar) and any(
                unsupported_feature(f"{original_path}.{a.name.value}")
                for a in updated.names):
            # `from horovod.spark import torch`: left for findings.py
            return updated.with_changes(module=original.module)
        ported = port_module_path(path)
        if ported is None:
            return updated
        return updated.with_changes(module=_name_node(ported))

    def visit_Attribute(self, node):
        # A horovod.x.y chain is ported whole in leave_Attribute; porting its
        # inner horovod.tensorflow first would turn an unsupported
        # horovod.tensorflow.data into tfring.data.
        path = dotted_name(node)
        return path is None or not path.startswith("horovod.")

    def leave_Attribute(self, original, updated):
        path = dotted_name(updated)
        if path is None or not path.startswith("horovod."):
            return updated
        ported = port_module_path(path)
        return _name_node(ported) if ported else updated

    def leave_Call(self, original, updated):
        if not m.matches(updated.func, m.Attribute(value=m.Name("horovod"),
                                                   attr=m.Name("run"))):
            return updated
        # horovod.run(fn, args=(), kwargs=None, np=..., ...) -> fn(*args, **kwargs)
        if not updated.args or updated.args[0].keyword is not None:
            return updated
        function = updated.args[0].value
        call_args = []
        for arg in updated.args[1:]:
            keyword = arg.keyword.value if arg.keyword else None
            if keyword == "args":
                call_args.append(cst.Arg(arg.value, star="*"))
            elif keyword == "kwargs":
                call_args.append(cst.Arg(arg.value, star="**"))
        return cst.Call(func=function, args=call_args)
