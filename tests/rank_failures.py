# What a size-agnostic test run under mpirun does when a rank fails: print
# the failing rank's report and abort the whole job.
#
# Why: a failing assertion on one rank would otherwise leave the other ranks
# waiting in a collective forever. Shared by the conftest.py of every folder
# whose files run at 1, 2 and 3 ranks (tests/distributed,
# tests/torch_distributed).

import sys


def world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def abort_on_failure(report, what):
    """Ends every rank of the job after a failed test `report` (no-op at
    one rank, where pytest reports it as usual)."""
    comm = world()
    if comm.Get_size() == 1:
        return
    text = getattr(report, "longreprtext", "") or str(report.longrepr)
    sys.stderr.write(
        f"\n===== tfring test {what} on rank {comm.Get_rank()} of "
        f"{comm.Get_size()}: {report.nodeid} ({report.when}) =====\n"
        f"{text}\n===== aborting the MPI job so no rank hangs =====\n")
    sys.stderr.flush()
    sys.stdout.flush()
    comm.Abort(1)


def pytest_hooks():
    """The pytest hooks a conftest.py re-exports: abort on a failed test or
    a failed collection, and the requires_ranks(n) marker."""
    import pytest

    def pytest_configure(config):
        config.addinivalue_line(
            "markers",
            "requires_ranks(n): skip unless at least n ranks take part")

    def pytest_runtest_logreport(report):
        if report.failed:
            abort_on_failure(report, "failure")

    def pytest_collectreport(report):
        if report.failed:
            abort_on_failure(report, "collection error")

    def pytest_runtest_setup(item):
        marker = item.get_closest_marker("requires_ranks")
        if marker is not None and world().Get_size() < marker.args[0]:
            pytest.skip(f"needs at least {marker.args[0]} ranks")

    return (pytest_configure, pytest_runtest_logreport,
            pytest_collectreport, pytest_runtest_setup)
