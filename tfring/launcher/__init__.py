"""tfringrun, the launcher: starts a tfring job with mpirun, or checks that one can start.

Why a package of its own: the launcher runs before any rank exists and
never uses TensorFlow or the core, so nothing here imports them (its
`--help` answers at once, and it runs where TensorFlow is not installed).

  cli.py      the command line: parses, runs the checks asked for, execs mpirun
  command.py  hosts and the mpirun command line
  knobs.py    the TFRING_* flags, one table
  checks.py   --check-build and --check-hosts
  probes.py   what those checks run on the ranks
  preload/    the library tfringrun preloads into mpirun (C++, libc only)
"""
