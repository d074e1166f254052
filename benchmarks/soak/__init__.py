"""The soak test's parts; `python benchmarks/soak` runs it (__main__.py).

  plan.py       what each step runs: random mixed collectives, per rank order
  calls.py      runs a step's calls (threads, eager and tf.function)
  reference.py  the NumPy result each call must give
  resources.py  memory, threads and file descriptors of this process
  report.py     rank 0's report and its checks
"""
