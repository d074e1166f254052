# horovod.tensorflow.mpi_ops' `_basics`, for code that reaches into it.
#
# Why: Horovod's process-set tests (and scripts copied from them) read the
# table of registered sets through the internal
# `hvd.mpi_ops._basics._get_process_set_ids_and_ranks()`. tfring keeps that
# path working; the public API stays in tfring itself.

from tfring import _core
from tfring import basics


class _Basics:
    """The part of Horovod's HorovodBasics object that code outside Horovod
    uses."""

    def _get_process_set_ids_and_ranks(self):
        """{process_set_id: sorted job ranks} of every registered process
        set, the global set (0) included, in ascending id order.

        Raises:
          ValueError: tfring is not initialized.
        """
        basics._check_initialized(
            "tfring.mpi_ops._basics._get_process_set_ids_and_ranks()")
        table = _core.process_sets()
        return {int(ps_id): [int(r) for r in table[ps_id]]
                for ps_id in sorted(table)}


_basics = _Basics()
