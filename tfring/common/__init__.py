# The framework-neutral Python layer that tfring's tensor-buffer front ends
# (tfring.torch, tfring.mxnet) stand on: how unnamed collectives are named,
# how the core's outcome of a buffer collective becomes a result or an
# exception, the exceptions themselves, and object collectives as pickled
# bytes. Nothing here imports a framework; the TensorFlow front end keeps
# its own (op-based) path at the package root.
