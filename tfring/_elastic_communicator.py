# The communicator of an elastic job, for tfring.init().
#
# Why a module of its own, with no imports: a rank started into a running
# elastic job merges its communicator with the others' before its script
# runs (tfring/elastic/joiner.py), and the script's plain tfring.init() must
# start on that one, not MPI_COMM_WORLD. tfring.basics reads it here;
# tfring/elastic/membership.py sets it (basics cannot import membership,
# which imports basics).

# The mpi4py communicator tfring.init() uses when given none, or None.
communicator = None
