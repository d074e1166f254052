# Open MPI's yield-when-idle setting, for this process's MPI_Init only.
#
# Why: Open MPI busy-polls while a rank waits in a collective. tfring's
# background thread waits there while TensorFlow or PyTorch computes, and on
# a machine with about one core per rank the spinning takes that core from
# the framework (measured: 0.67 -> 0.83 of the no-communication ceiling for
# a small CNN on 2 cores, no loss on the allreduce benchmark). Setting
# OMPI_MCA_mpi_yield_when_idle=1 asks it to yield instead. Open MPI reads the
# variable once, in MPI_Init, so tfring puts it in the environment only for
# the call that starts MPI in this process and takes it away again: child
# processes (DataLoader workers, subprocesses, another MPI program started
# by the script) do not inherit it. A value the user set stays as it is.
#
# MPI starts either when mpi4py.MPI is imported (by the script or by
# tfring.init()) or, after `mpi4py.rc.initialize = False`, in tfring.init();
# the import hook below covers the first, basics.py the second. A script
# that imported mpi4py.MPI before tfring has MPI running already: nothing
# changes there.

import contextlib
import importlib.abc
import os
import sys

VARIABLE = "OMPI_MCA_mpi_yield_when_idle"
_MODULE = "mpi4py.MPI"


@contextlib.contextmanager
def while_mpi_starts():
    """The variable set to 1 inside the block, unless the user set it."""
    if VARIABLE in os.environ:
        yield
        return
    os.environ[VARIABLE] = "1"
    try:
        yield
    finally:
        os.environ.pop(VARIABLE, None)


class _YieldingLoader(importlib.abc.Loader):
    """mpi4py.MPI's own loader, run with the variable set (the module starts
    MPI while it loads)."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        with while_mpi_starts():
            return self._loader.create_module(spec)

    def exec_module(self, module):
        with while_mpi_starts():
            self._loader.exec_module(module)


class _MpiImportFinder(importlib.abc.MetaPathFinder):
    """Finds mpi4py.MPI through the finders after it (mpi4py 4 adds one of
    its own, which picks the build for the MPI library) and wraps its
    loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None:
                spec.loader = _YieldingLoader(spec.loader)
            return spec
        return None


def install_import_hook():
    """Sets the variable around mpi4py.MPI's import, unless it happened."""
    if _MODULE in sys.modules or any(
            isinstance(f, _MpiImportFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _MpiImportFinder())
