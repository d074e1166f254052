"""tfringrun, the launcher: starts a tfring job with mpirun, or checks that one can start.

Why a package of its own: the launcher runs before any rank exists and
never uses TensorFlow or PyTorch, so nothing here imports them but the
checks (its `--help` answers at once, and it runs where neither is
installed); of the core it reads only the knobs' defaults.

  cli.py        the command line: parses, runs the checks asked for and mpirun
  supervise.py  waits for mpirun, passes its exit status on, reports Ctrl-C
  daemon_loss.py  spots PRRTE ending the job on a lost host's daemon
  restart.py    starts an elastic job again without a lost host
  command.py    hosts and the mpirun command line
  knobs.py      the TFRING_* flags, one table
  checks.py     --check-build and --check-hosts
  probes.py     what those checks run on the ranks
  preload/      the library tfringrun preloads into mpirun (C++, libc only)
"""
