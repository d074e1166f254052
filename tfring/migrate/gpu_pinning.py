# TF1 GPU pinning -> TensorFlow 2's tf.config.
#
# Horovod-era scripts pin each rank to one GPU through a session config:
#     config = tf.ConfigProto()
#     config.gpu_options.allow_growth = True
#     config.gpu_options.visible_device_list = str(hvd.local_rank())
#     K.set_session(tf.Session(config=config))
# TensorFlow 2 has no ConfigProto or sessions in its main namespace; the
# statements that build and install such a config are replaced, where the
# first of them stood, by the tf.config equivalent (memory growth, then the
# local rank's GPU as the only visible one). The rank expression is taken
# from visible_device_list when the script sets it. TF1's
# tf.enable_eager_execution(config=config) goes too (TF2 is eager).

from tfring.migrate._libcst import cst, m
from tfring.migrate.findings import dotted_name

_TF2_PINNING = """\
gpus = tf.config.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.set_visible_devices(gpus[{rank}], "GPU")
"""


def _is_config_proto(node):
    name = dotted_name(node.func) if isinstance(node, cst.Call) else None
    return name is not None and name.split(".")[-1] == "ConfigProto"


def _is_set_session(node):
    name = dotted_name(node.func) if isinstance(node, cst.Call) else None
    return name is not None and name.split(".")[-1] == "set_session"


def _is_eager_switch(statement):
    """tf.enable_eager_execution(...) (TF1's switch, often given the session
    config): TensorFlow 2 runs eagerly, so the statement just goes."""
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return False
    name = dotted_name(small.value.func)
    return name is not None and name.split(".")[-1] == "enable_eager_execution"


def _rank_expression(value):
    """`hvd.local_rank()` out of str(hvd.local_rank()), else None."""
    if m.matches(value, m.Call(func=m.Name("str"), args=[m.Arg()])):
        return value.args[0].value
    return None


class GpuPinning(cst.CSTTransformer):

    def __init__(self, default_rank="hvd.local_rank()"):
        super().__init__()
        self.default_rank = default_rank
        self.config_names = set()
        self.rank = None
        self.rewrote = False

    def _pinning_statement(self, statement):
        """Whether a simple statement builds or installs a session config
        (and learns the config's name and the rank expression from it)."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = dotted_name(small.targets[0].target) or ""
            if _is_config_proto(small.value):
                self.config_names.add(target)
                return True
            root = target.split(".")[0]
            if root in self.config_names:
                if target.endswith("visible_device_list"):
                    self.rank = _rank_expression(small.value) or self.rank
                return True
            return False
        if isinstance(small, cst.Expr) and _is_set_session(small.value):
            return True
        return _is_eager_switch(statement)

    def _rewrite_block(self, statements):
        for statement in statements:  # learn the config names and the rank
            self._pinning_statement(statement)
        result, inserted = [], False
        for statement in statements:
            if self._pinning_statement(statement):
                if not inserted and not _is_eager_switch(statement):
                    rank = (cst.Module([]).code_for_node(self.rank)
                            if self.rank is not None else self.default_rank)
                    block = cst.parse_module(_TF2_PINNING.format(rank=rank)).body
                    block = list(block)
                    block[0] = block[0].with_changes(
                        leading_lines=statement.leading_lines)
                    result.extend(block)
                    inserted = True
                    self.rewrote = True
                continue
            result.append(statement)
        return result

    def leave_Module(self, original, updated):
        return updated.with_changes(body=self._rewrite_block(list(updated.body)))

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=self._rewrite_block(list(updated.body)))
