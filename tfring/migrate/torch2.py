# PyTorch changes that Horovod-era scripts (torch 1.x) meet on torch 2.x:
#   torch.cuda.amp.autocast(...)   -> torch.amp.autocast("cuda", ...)
#   torch.cuda.amp.GradScaler(...) -> torch.amp.GradScaler("cuda", ...)
#     (and torch.cpu.amp's): deprecated since torch 2.4 with a FutureWarning
#     on every call, on their way out. autocast's positional arguments
#     become keywords, since torch.amp.autocast takes them in another
#     order. `from torch.cuda.amp import autocast, GradScaler` becomes
#     `from torch.amp import ...` with the device added to each call.
#   F.nll_loss(..., size_average=False) -> reduction='sum' (any loss of
#     torch.nn.functional or torch.nn with size_average= / reduce=, when
#     their values are written as True / False / None): deprecated since
#     torch 0.4, a warning on every call.
# Every rewrite is keyed on what the name is imported from (names.py), so a
# TensorFlow script's `autocast` or a user's own loss are left alone.
# Left as they are, on purpose: torch.load (torch 2.6 loads with
# weights_only=True; state_dict checkpoints load, and restoring full
# unpickling would undo a safety default), F.log_softmax(x) without dim (the
# implicit dim depends on the input's rank, which the script text does not
# show; it still works, with a warning).

from tfring.migrate._libcst import cst, metadata
from tfring.migrate.findings import dotted_name
from tfring.migrate.names import imported_names

_AMP_MODULES = {"torch.cuda.amp": "cuda", "torch.cpu.amp": "cpu"}
_AMP_CLASSES = ("autocast", "GradScaler")
# torch.cuda.amp.autocast(enabled, dtype, cache_enabled) positionally;
# torch.amp.autocast(device_type, dtype, enabled, cache_enabled).
_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
_LEGACY_REDUCTION = ("size_average", "reduce")


def _amp_target(names):
    """(device, class) for torch.cuda.amp.autocast and the like, else None."""
    for name in names:
        module, _, cls = name.rpartition(".")
        if module in _AMP_MODULES and cls in _AMP_CLASSES:
            return _AMP_MODULES[module], cls
    return None


def _keyword(name, value, comma):
    return cst.Arg(value=value, keyword=cst.Name(name), comma=comma,
                   equal=cst.AssignEqual(
                       whitespace_before=cst.SimpleWhitespace(""),
                       whitespace_after=cst.SimpleWhitespace("")))


def _with_device(args, device, cls):
    """The call's arguments with the device in front; autocast's
    positional ones as keywords."""
    rest = []
    for index, arg in enumerate(args):
        if (cls == "autocast" and arg.keyword is None and not arg.star
                and index < len(_AUTOCAST_POSITIONAL)):
            arg = _keyword(_AUTOCAST_POSITIONAL[index], arg.value, arg.comma)
        rest.append(arg)
    comma = (cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if rest
             else cst.MaybeSentinel.DEFAULT)
    return [cst.Arg(cst.SimpleString(f'"{device}"'), comma=comma)] + rest


def _literal(arg):
    """True / False / None for an argument written as such; else a marker
    that the value is not known from the text."""
    if arg is None:
        return None
    if isinstance(arg.value, cst.Name) and arg.value.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[arg.value.value]
    return _UNKNOWN


_UNKNOWN = object()


def _reduction(size_average, reduce):
    """What torch makes of the legacy pair (torch.nn._reduction's rule)."""
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if size_average and reduce:
        return "mean"
    return "sum" if reduce else "none"


def _amp_import_is_portable(node):
    """`from torch.cuda.amp import autocast, GradScaler [as x]` with
    nothing else imported: it can become `from torch.amp import ...`."""
    return (node.module is not None and not node.relative
            and dotted_name(node.module) in _AMP_MODULES
            and not isinstance(node.names, cst.ImportStar)
            and all(a.name.value in _AMP_CLASSES for a in node.names))


class Torch2(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (metadata.QualifiedNameProvider,)

    def __init__(self):
        super().__init__()
        self.portable_amp_names = set()  # bound by a portable amp import
        self.other_amp_names = set()     # bound by an import left alone

    def visit_ImportFrom(self, node):
        if (node.module is None or node.relative or isinstance(node.names, cst.ImportStar)
                or dotted_name(node.module) not in _AMP_MODULES):
            return
        bound = {(a.asname.name if a.asname else a.name).value for a in node.names}
        if _amp_import_is_portable(node):
            self.portable_amp_names |= bound
        else:
            self.other_amp_names |= bound

    def leave_ImportFrom(self, original, updated):
        if _amp_import_is_portable(original):
            return updated.with_changes(module=cst.parse_expression("torch.amp"))
        return updated

    def _amp_function(self, func):
        """The new callee for an amp class reached through `func`, or None
        when this use stays (an import that also brings other names)."""
        if isinstance(func, cst.Name):
            portable = (func.value in self.portable_amp_names
                        and func.value not in self.other_amp_names)
            return func if portable else None
        path = dotted_name(func) or ""
        parts = path.split(".")
        # X.cuda.amp.autocast -> X.amp.autocast, X being torch (as imported).
        if len(parts) >= 4 and parts[-3] in ("cuda", "cpu") and parts[-2] == "amp":
            return cst.parse_expression(".".join(parts[:-3] + parts[-2:]))
        return None

    def leave_Call(self, original, updated):
        names = imported_names(self, original.func)
        amp = _amp_target(names)
        if amp is not None:
            func = self._amp_function(updated.func)
            if func is None:
                return updated
            device, cls = amp
            return updated.with_changes(
                func=func, args=_with_device(list(updated.args), device, cls))
        if any(n.startswith("torch.nn.") for n in names):
            return self._legacy_reduction(updated)
        return updated

    def _legacy_reduction(self, call):
        given = {a.keyword.value: a for a in call.args
                 if a.keyword and a.keyword.value in _LEGACY_REDUCTION}
        if not given:
            return call
        values = [_literal(given.get(k)) for k in _LEGACY_REDUCTION]
        if _UNKNOWN in values:
            return call  # computed at run time: torch's warning stays
        reduction = _reduction(*values)
        args, placed = [], False
        for arg in call.args:
            keyword = arg.keyword.value if arg.keyword else None
            if keyword == "reduction":
                continue  # the legacy arguments override it in torch
            if keyword in _LEGACY_REDUCTION:
                if not placed:
                    args.append(arg.with_changes(
                        keyword=cst.Name("reduction"),
                        value=cst.SimpleString(f"'{reduction}'")))
                    placed = True
                continue
            args.append(arg)
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
        return call.with_changes(args=args)
