"""Thin Python wrappers of tfring's TensorFlow ops.

Each wrapper creates one op of `libtfring_ops.so`. Validation of user
arguments, compression and grouping live in the public API (`tfring`); these
functions only decide the name under which the core matches the tensor
across ranks.

Naming rule. The core pairs up the tensors of different ranks by name, so a
name must be identical on every rank and unique among the tensors in flight
at the same time. A collective's name depends only on what it is called,
never on how many other collectives a rank built before it, so ranks may
build differently named collectives in different orders (iterating a `set`
of names, whose string hashes differ per process, or a directory listing),
as with Horovod:

* The key. A collective built with `name=` is keyed by that name. One built
  without is keyed `<kind>.<n>` (`allreduce.0`), n counting the unnamed
  collectives of that kind built before it in the same function (or eagerly
  left empty, see below), so unnamed collectives must be built in the same
  order on every rank. In process set k (not 0), `.ps<k>` is appended to a
  name (`grad_w.ps1`) and inserted before n (`allreduce.ps1.0`).
* Eager: the op's `tensor_name` attribute is the key of a named collective.
  An unnamed one gets an empty name, which makes the kernel use its node
  name, in eager mode the op type (`Tfring>Allreduce`) for every call; that
  is safe because eager ops issued from one thread run one after another.
  Callers that issue eager collectives from several threads must pass
  distinct names. TensorFlow caches one eager kernel per distinct attribute
  value, so eager names should come from a bounded set (variable names, a
  fixed key); a fresh name on every call (a per-call counter) costs a new
  kernel each time (measured: ~35 KB kept forever and ~0.4 ms per call,
  against ~20 us for a repeated name).
* Graph (inside `tf.function`, or a `tf.compat.v1.Graph`): `tensor_name` is
  set when the op is built. Copies of one key in one function (the same
  `name=` twice, or a library that names several collectives alike, as
  SyncBatchNormalization does) are numbered in the order they are built:
  the first is the key, later ones get `@1`, `@2`, ... Copies of one name
  must therefore be built in the same order on every rank; other names do
  not change their numbers. Inside a `tf.function` the name is qualified by
  the function: `train_step/grad_w`, `train_step/grad_w@1`,
  `train_step/allreduce.0`; in a `tf.compat.v1.Graph` it is the key and copy
  number alone (`grad_w`, `grad_w@1`). Bodies of `tf.cond` /
  `tf.while_loop` count in the enclosing function. Function names carry no
  process-wide counter (the backward function of `train_step`,
  `__backward_train_step_1234`, counts as `backward_train_step`), since a
  name that differs between ranks would never be matched. Node names are
  not used: TensorFlow numbers name scopes in the order they are opened, so
  a scope opened on one rank only (a summary under `if rank() == 0`) would
  rename every later node on that rank.
  When TensorFlow prepares a function to run, the graph pass in
  kernels/collective_naming_pass.cc prefixes each name with the function
  being run: a `tf.function` helper inlined into two functions f and g gets
  `f/helper/allreduce.0` and `g/helper/allreduce.0`, so f and g may run
  concurrently with different values. Copies that inlining creates (a
  helper called twice) are numbered `@0`, `@1`, ... in the order of their
  call sites.
* Gradients (gradients.py) are named after their forward op,
  `<forward key>_grad` (`grad_w_grad`, `allreduce.0_grad`), in the forward
  op's process set, so they match whatever order TensorFlow builds them in.

Process sets. Every wrapper takes `process_set_id` (0, the default, is the
whole job), which becomes the op's attribute of that name; only the set's
ranks may run the op. Keys and copy numbers are per process set, so ranks of
disjoint sets may trace different collectives in the same function
(`if ps.included(): ...`) and still agree on the names of the collectives
they share, and one name may be used in several sets at once.

Limits of the rule (the core then fails the second tensor in flight with an
error naming it, rather than pairing it): two `tf.function`s with the same
Python name (or names differing only in a trailing `_<digits>`) running
concurrently, one concrete function running in several threads at once, a
`tf.while_loop` with `parallel_iterations > 1` whose iterations overlap, or
a helper shared by functions compiled with XLA (whose bodies the graph pass
does not see) running concurrently. User names ending in `@<digits>` or
`.ps<digits>` may collide with the copies or sets of another name.

XLA. Inside tf.function(jit_compile=True) or a Keras model compiled with
jit_compile=True, allreduce and broadcast are compiled to XLA custom calls
on the CPU (kernels/xla_kernels.cc, kernels/xla_custom_calls.cc), under the
same node names. Allgather and alltoall cannot be compiled (their output
shapes are known only at run time): allgather_op and alltoall_op raise a
ValueError naming jit_compile=False while the function is traced.
"""

import re
import weakref

import tensorflow as tf
from tensorflow.python.framework import func_graph
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_util
from tensorflow.python.ops import control_flow_v2_func_graphs

from tfring.ops.loader import load_ops_library

_ops_library = load_ops_library()

__all__ = [
    "allreduce_op",
    "allgather_op",
    "broadcast_op",
    "alltoall_op",
    "reducescatter_op",
    "join_op",
    "size_op",
    "rank_op",
    "local_size_op",
    "local_rank_op",
    "process_set_included_op",
    "process_set_rank_op",
]

# Characters TensorFlow accepts in a name scope (and in one level of a node
# name); a scope must also start with a letter, a digit or a dot.
_INVALID_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")
_INVALID_SCOPE_START = re.compile(r"^[^A-Za-z0-9.]+")
_TRAILING_COUNTER = re.compile(r"_[0-9]+$")


def _scope_for_graph_name(graph_name):
    """A name scope from a FuncGraph's name, the same on every rank.

    `train_step` -> `train_step`, `<lambda>` -> `lambda_`,
    `__backward_train_step_1234` -> `backward_train_step`. TensorFlow names
    the graphs it generates (backward functions, control-flow bodies) with a
    process-wide counter that differs between ranks that traced different
    numbers of functions, so trailing `_<digits>` are dropped.
    """
    scope = graph_name
    while True:
        stripped = _TRAILING_COUNTER.sub("", scope)
        if stripped == scope:
            break
        scope = stripped
    scope = _INVALID_SCOPE_CHARS.sub("_", scope)
    scope = _INVALID_SCOPE_START.sub("", scope)
    return scope or "function"


def _naming_graph(graph):
    """The graph whose collectives are numbered together with `graph`'s.

    That is the tf.function (a FuncGraph) or the tf.compat.v1.Graph that
    `graph` belongs to: a cond branch or loop body graph is part of the graph
    that encloses it.
    """
    control_flow_graph = control_flow_v2_func_graphs.ControlFlowFuncGraph
    while (isinstance(graph, control_flow_graph)
           and graph.outer_graph is not None):
        graph = graph.outer_graph
    return graph


# How many collectives of each name (per process set) each naming graph
# holds so far: the copy numbers of the names above.
_collectives_built = weakref.WeakKeyDictionary()


def collective_label(kind, name, process_set_id, occurrence):
    """The key of a collective within its function (or v1 graph).

    `name` for the first collective of that name in process set 0, with
    `.ps<k>` added in set k and `@<occurrence>` added for later copies of
    the name; an unnamed collective is `<kind>.<occurrence>`
    (`<kind>.ps<k>.<occurrence>`), counting the unnamed ones of its kind.
    """
    in_set = f".ps{process_set_id}" if process_set_id else ""
    if not name:
        return f"{kind}{in_set}.{occurrence}"
    return f"{name}{in_set}@{occurrence}" if occurrence else f"{name}{in_set}"


def _graph_tensor_name(graph, kind, name, process_set_id=0):
    """The cross-rank name of the next collective of set `process_set_id`
    named `name` (or, unnamed, of kind `kind`) built in `graph`."""
    owner = _naming_graph(graph)
    counts = _collectives_built.setdefault(owner, {})
    # A named collective counts only its own name, so the order in which
    # differently named ones are built does not matter.
    key = (process_set_id, name) if name else (process_set_id, None, kind)
    occurrence = counts.get(key, 0)
    counts[key] = occurrence + 1
    label = collective_label(kind, name, process_set_id, occurrence)
    if not isinstance(owner, func_graph.FuncGraph):
        return label  # a tf.compat.v1.Graph: no function to name
    return f"{_scope_for_graph_name(owner.name)}/{label}"


def gradient_base_name(op):
    """The name the gradient of collective `op` derives its own from.

    The forward op's cross-rank name without the process set part (the
    gradient runs in the same set and adds it again) and, in a graph,
    without the function's scope (the gradient is qualified by the function
    that builds it). None for a forward op without a name.
    """
    tensor_name = op.get_attr("tensor_name")
    if isinstance(tensor_name, bytes):
        tensor_name = tensor_name.decode("utf-8")
    if not tensor_name:
        return None
    if not tf.executing_eagerly():
        # A tape passes a stand-in op without a graph; it recorded the op
        # in the graph that now builds the gradient.
        owner = _naming_graph(getattr(op, "graph", None)
                              or ops.get_default_graph())
        if isinstance(owner, func_graph.FuncGraph):
            scope = _scope_for_graph_name(owner.name) + "/"
            if tensor_name.startswith(scope):
                tensor_name = tensor_name[len(scope):]
    process_set_id = op.get_attr("process_set_id")
    if process_set_id:
        tensor_name = re.sub(rf"\.ps{process_set_id}(?=([.@][0-9]+)?$)", "",
                             tensor_name, count=1)
    return tensor_name


def _node_name(name):
    """`name` as a valid node name (None for none): node names only label
    the graph, the cross-rank name is the `tensor_name` attribute."""
    if not name:
        return None
    node_name = _INVALID_SCOPE_CHARS.sub("_", name)
    return _INVALID_SCOPE_START.sub("", node_name) or None


def _create_collective(op_fn, kind, inputs, name, process_set_id=0,
                       **attrs):
    """Creates the op `op_fn` on `inputs` (a tensor, or a tuple of the op's
    inputs) in process set `process_set_id`, under the naming rule of this
    module."""
    if not isinstance(inputs, tuple):
        inputs = (inputs,)
    process_set_id = int(process_set_id)
    if tf.executing_eagerly():
        tensor_name = (collective_label(kind, name, process_set_id, 0)
                       if name else "")
        return op_fn(*inputs, tensor_name=tensor_name,
                     process_set_id=process_set_id, **attrs)
    tensor_name = _graph_tensor_name(ops.get_default_graph(), kind, name,
                                     process_set_id)
    return op_fn(*inputs, tensor_name=tensor_name, name=_node_name(name),
                 process_set_id=process_set_id, **attrs)


def in_xla_compilation():
    """Whether ops created now will be compiled by XLA.

    True inside tf.function(jit_compile=True), Keras' train/test/predict
    functions after model.compile(..., jit_compile=True), and any function
    or control-flow body traced from inside them.
    """
    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())


def _reject_under_xla(what, why):
    """Raises at trace time if `what` is being built into an XLA program."""
    if not in_xla_compilation():
        return
    raise ValueError(
        f"tfring cannot compile {what} with XLA: {why} This function is being "
        "compiled with XLA (tf.function(jit_compile=True), or a Keras model "
        "compiled with jit_compile=True or jit_compile='auto' on a GPU). "
        "tfring's allreduce, grouped_allreduce, reducescatter and broadcast "
        "work under XLA on CPU; allgather and alltoall do not. Compile this "
        "function without XLA: "
        "tf.function(..., jit_compile=False) or "
        "model.compile(..., jit_compile=False).")


def allreduce_op(tensor, reduce_op, prescale_factor=1.0,
                 postscale_factor=1.0, name=None, process_set_id=0,
                 group=None, compression=0):
    """Reduces `tensor` element-wise over all ranks; all get the result.

    Args:
      tensor: the local tensor; same shape and dtype on every rank. dtype
        one of uint8, int8, int32, int64, float16, bfloat16, float32,
        float64.
      reduce_op: an int or `tfring._core.ReduceOp`: Average (0), Sum (1),
        Min (3), Max (4) or Product (5).
      prescale_factor: multiplies each rank's input before the reduction.
      postscale_factor: multiplies the result after the reduction.
      name: the cross-rank name (see the module docstring).
      process_set_id: the process set to reduce over (0: every rank).
      group: (key, size) when this op is one of `size` made by one grouped
        call (key: this process's id of that call); the core then starts
        the group's negotiation once all of them are submitted.
      compression: a `tfring._core.WireCompression` value: how float32
        Sum/Average data crosses hosts (0: as TFRING_WIRE_COMPRESSION says).

    Returns:
      A tensor of the same shape and dtype as `tensor`.
    """
    group_key, group_size = group if group is not None else (0, 1)
    return _create_collective(_ops_library.tfring_allreduce, "allreduce",
                              tensor, name, process_set_id,
                              reduce_op=int(reduce_op),
                              prescale_factor=float(prescale_factor),
                              postscale_factor=float(postscale_factor),
                              group_key=int(group_key),
                              group_size=int(group_size),
                              compression=int(compression))


def allgather_op(tensor, name=None, process_set_id=0):
    """Concatenates every rank's `tensor` along dimension 0, in rank order.

    Args:
      tensor: the local tensor; the first dimension may differ between ranks,
        the others and the dtype must not. A scalar counts as one row, so
        scalars gather to a vector with one element per rank.
      name: the cross-rank name (see the module docstring).
      process_set_id: the process set to gather over (0: every rank); the
        result is in the order of its ranks.

    Returns:
      A tensor whose first dimension is the sum over ranks.

    Raises:
      ValueError: when traced into an XLA-compiled function (see
        xla_kernels.cc).
    """
    _reject_under_xla(
        "allgather" + (f" of tensor '{name}'" if name else ""),
        "its output's first dimension is the sum of every rank's, known only "
        "when the program runs, and XLA needs all shapes when it compiles. "
        "tfring also allgathers the tf.IndexedSlices gradients of "
        "embeddings (pass sparse_as_dense=True to DistributedGradientTape / "
        "DistributedOptimizer to allreduce them densely instead) and uses "
        "allgather in the gradient of a Product allreduce.")
    return _create_collective(_ops_library.tfring_allgather, "allgather",
                              tensor, name, process_set_id)


def broadcast_op(tensor, root_rank, name=None, process_set_id=0):
    """Returns the value of `tensor` on rank `root_rank`, on every rank.

    Args:
      tensor: the local tensor; same shape and dtype on every rank (only the
        root's values are used).
      root_rank: the job rank whose values are sent, in [0, size); in a
        process set, one of the set's (job) ranks.
      name: the cross-rank name (see the module docstring).
      process_set_id: the process set to broadcast in (0: every rank).

    Returns:
      A tensor of the same shape and dtype as `tensor`.
    """
    return _create_collective(_ops_library.tfring_broadcast, "broadcast",
                              tensor, name, process_set_id,
                              root_rank=int(root_rank))


def alltoall_op(tensor, splits, name=None, process_set_id=0):
    """Sends splits[j] rows of dimension 0 to rank j; receives from all.

    Args:
      tensor: the local tensor, at least one dimension; dimension 0 may
        differ between ranks, the others and the dtype must not.
      splits: an int32 vector with one entry per rank (rows sent to each
        rank, in rank order, summing to dimension 0), or an empty one to
        split dimension 0 evenly. The core checks it on every rank. In a
        process set: one entry per rank of the set, in the set's order.
      name: the cross-rank name (see the module docstring).
      process_set_id: the process set to exchange in (0: every rank).

    Returns:
      (output, received_splits): the rows received from every rank,
      concatenated in rank order, and how many came from each (int32).

    Raises:
      ValueError: when traced into an XLA-compiled function.
    """
    _reject_under_xla(
        "alltoall" + (f" of tensor '{name}'" if name else ""),
        "its output's first dimension depends on every rank's splits, known "
        "only when the program runs, and XLA needs all shapes when it "
        "compiles.")
    return _create_collective(_ops_library.tfring_alltoall, "alltoall",
                              (tensor, splits), name, process_set_id)


def reducescatter_op(tensor, reduce_op, prescale_factor=1.0,
                     postscale_factor=1.0, name=None, process_set_id=0):
    """Reduces `tensor` over all ranks; rank i keeps block i of dimension 0.

    Args:
      tensor: the local tensor, at least one dimension; same shape and dtype
        on every rank (the dtypes of allreduce_op).
      reduce_op: Average (0) or Sum (1).
      prescale_factor, postscale_factor: as for allreduce_op.
      name: the cross-rank name (see the module docstring).
      process_set_id: the process set to reduce over (0: every rank); its
        i-th rank keeps block i.

    Returns:
      This rank's rows of the result: dimension 0 divided evenly, the first
      `dim0 % size` ranks one row more.
    """
    return _create_collective(_ops_library.tfring_reducescatter,
                              "reducescatter", tensor, name, process_set_id,
                              reduce_op=int(reduce_op),
                              prescale_factor=float(prescale_factor),
                              postscale_factor=float(postscale_factor))


def join_op(name=None):
    """Declares this rank out of data; an int32 scalar: the last rank to join.

    Until every rank has joined, this rank takes part in the other ranks'
    allreduces with zeros (see tfring.join).
    """
    return _ops_library.tfring_join(name=name)


def size_op(process_set_id=0, name=None):
    """The number of ranks (of process set `process_set_id`; 0: the job), as
    an int32 scalar tensor evaluated when run."""
    return _ops_library.tfring_size(process_set_id=int(process_set_id),
                                    name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 if this rank is in process set `process_set_id`, else 0, as an
    int32 scalar tensor evaluated when run (an error if the set does not
    exist then)."""
    return _ops_library.tfring_process_set_included(
        process_set_id=int(process_set_id), name=name)


def process_set_rank_op(process_set_id=0, name=None):
    """This rank's position in process set `process_set_id` (the index of
    tfring.rank() among the set's sorted ranks), as an int32 scalar tensor
    evaluated when run; an error on a rank outside the set."""
    return _ops_library.tfring_process_set_rank(
        process_set_id=int(process_set_id), name=name)


def rank_op(name=None):
    """This process's rank, as an int32 scalar tensor evaluated when run."""
    return _ops_library.tfring_rank(name=name)


def local_size_op(name=None):
    """The number of ranks on this host, as an int32 scalar tensor."""
    return _ops_library.tfring_local_size(name=name)


def local_rank_op(name=None):
    """This process's rank on its host, as an int32 scalar tensor."""
    return _ops_library.tfring_local_rank(name=name)
