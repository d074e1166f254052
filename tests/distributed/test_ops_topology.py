# The topology ops (Tfring>Size, Rank, LocalSize, LocalRank) at any number of
# ranks, the op registrations (namespaced names, which ops are stateful), one
# core shared by the op library and tfring._core, and the error every op
# gives before tfring.init() and after tfring.shutdown() (checked in a fresh
# one-process job, since this one is initialized by the conftest).

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

import tfring
from tfring import ops

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _expected_topology():
    return [tfring.size(), tfring.rank(), tfring.local_size(),
            tfring.local_rank()]


def test_topology_ops_eager():
    got = [int(op()) for op in (ops.size_op, ops.rank_op, ops.local_size_op,
                                ops.local_rank_op)]
    assert got == _expected_topology()


def test_topology_ops_in_function():
    @tf.function
    def topology():
        return (ops.size_op(), ops.rank_op(), ops.local_size_op(),
                ops.local_rank_op())

    got = [int(t) for t in topology()]
    assert got == _expected_topology()
    for t in topology.get_concrete_function().outputs:
        assert t.dtype == tf.int32 and t.shape.rank == 0


def test_topology_matches_mpi():
    from mpi4py import MPI
    assert int(ops.size_op()) == MPI.COMM_WORLD.Get_size()
    assert int(ops.rank_op()) == MPI.COMM_WORLD.Get_rank()


def test_op_registrations():
    stateful = {"Tfring>Size": True, "Tfring>Rank": True,
                "Tfring>LocalSize": True, "Tfring>LocalRank": True,
                # Stateless so tf.function does not chain them (see
                # collective_ops.cc).
                "Tfring>Allreduce": False, "Tfring>Allgather": False,
                "Tfring>Broadcast": False}
    for name, is_stateful in stateful.items():
        op_def = op_def_registry.get(name)
        assert op_def is not None, name
        assert op_def.is_stateful == is_stateful, name


def test_collectives_get_no_automatic_control_dependencies():
    x = tf.constant([1.0])

    @tf.function
    def step():
        return [ops.allreduce_op(x, tfring.Sum), ops.allgather_op(x),
                ops.broadcast_op(x, 0), ops.allreduce_op(x, tfring.Max)]

    graph = step.get_concrete_function().graph
    collectives = [op for op in graph.get_operations()
                   if op.type.startswith("Tfring>")]
    assert len(collectives) == 4
    for op in collectives:
        assert not op.control_inputs, op.name


def test_one_core_shared_with_the_python_module():
    # The op kernels see the initialization done through tfring._core.
    assert int(ops.size_op()) == tfring.size()
    with open("/proc/self/maps") as maps:
        core_paths = {line.split()[-1] for line in maps
                      if line.rstrip().endswith("/libtfring_core.so")}
    assert len(core_paths) == 1, core_paths


_BEFORE_INIT_SCRIPT = textwrap.dedent("""
    import json
    import tensorflow as tf
    from tfring import ops

    x = tf.constant([1.0])
    attempts = {
        "size": ops.size_op, "rank": ops.rank_op,
        "local_size": ops.local_size_op, "local_rank": ops.local_rank_op,
        "allreduce": lambda: ops.allreduce_op(x, 1, name="grads"),
        "allgather": lambda: ops.allgather_op(x),
        "broadcast": lambda: ops.broadcast_op(x, 0),
        "allreduce_in_function": tf.function(
            lambda: ops.allreduce_op(x, 1)),
        "size_in_function": tf.function(lambda: ops.size_op()),
    }

    def try_all():
        errors = {}
        for what, attempt in attempts.items():
            try:
                attempt()
                errors[what] = None
            except tf.errors.OpError as e:
                errors[what] = [type(e).__name__, e.message]
        return errors

    before_init = try_all()
    import tfring
    tfring.init()  # a one-process MPI job
    # Traced before init: the stateful size op was not folded into it.
    size_after_init = int(attempts["size_in_function"]())
    tfring.shutdown()
    print("RESULT" + json.dumps({"before_init": before_init,
                                 "size_after_init": size_after_init,
                                 "after_shutdown": try_all()}))
""")


def _without_mpi_launcher_environment():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}


def test_ops_fail_clearly_before_init_and_after_shutdown():
    env = _without_mpi_launcher_environment()
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _BEFORE_INIT_SCRIPT],
                          env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    result = json.loads(line[len("RESULT"):])
    assert result["size_after_init"] == 1
    for when in ("before_init", "after_shutdown"):
        errors = result[when]
        for what, error in errors.items():
            assert error is not None, f"{what} ran {when}"
            kind, message = error
            assert kind == "FailedPreconditionError", (when, what, error)
            assert "tfring is not initialized" in message, (when, what)
            assert "Call tfring.init()" in message, (when, what, message)
        assert "allreduce of tensor 'grads'" in errors["allreduce"][1]
        assert "Tfring>Size" in errors["size"][1]
