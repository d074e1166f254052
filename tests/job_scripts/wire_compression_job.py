"""Wire compression across hosts; run by tests/test_multihost.py.

Every rank reduces the same float32 tensors (varied magnitudes, both signs,
one tensor of values near 1e30) with Compression.none, bf16_wire and
fp16_wire, and checks each result against the float64 sum of every rank's
input (computed here): uncompressed within float32 rounding, bf16 and fp16
within the bounds of two encodings (the sum of arrivals, then the sum).
It also checks that the compressed results differ from the uncompressed
ones somewhere (the data did cross hosts encoded) and that every rank holds
the same bits. Prints `RESULT <json>` with the checks and their failures.

Usage: wire_compression_job.py (under tfringrun, ranks on several hosts)
"""
import json
import os

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)

import tfring  # noqa: E402

tfring.init()
rank, size = tfring.rank(), tfring.size()
checks, failures = [], []
JOB_DEFAULT = os.environ.get("TFRING_WIRE_COMPRESSION", "none")
# Relative to the sum of magnitudes: two roundings to 8 (bf16) or 11 (fp16)
# significant bits, plus float32 additions; fp16 adds its subnormal floor,
# relative to the largest sum of its block.
RELATIVE = {"none": 2.0 ** -20, "bf16": 2.0 ** -7, "fp16": 2.0 ** -9}
FLOOR = {"none": 0.0, "bf16": 0.0, "fp16": 2.0 ** -34}


def rank_values(r, count, scale_exponents):
    rng = np.random.default_rng(1000 + r)
    values = rng.standard_normal(count) * 10.0 ** rng.integers(*scale_exponents, count)
    return values.astype(np.float32)


def check(name, ok, detail):
    checks.append(name)
    if not ok:
        failures.append(f"{name}: {detail}")


TENSORS = {"varied": (30011, (-4, 4)), "huge": (1000, (29, 31))}
for label, (count, exponents) in TENSORS.items():
    inputs = [rank_values(r, count, exponents) for r in range(size)]
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    magnitude = np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0)
    results = {}
    for compression in (tfring.Compression.none, tfring.Compression.bf16_wire,
                        tfring.Compression.fp16_wire):
        wire = getattr(compression, "wire", "none")
        effective = wire if wire != "none" else JOB_DEFAULT
        out = tfring.allreduce(tf.constant(inputs[rank]), op=tfring.Sum,
                               compression=compression,
                               name=f"{label}.{wire}").numpy()
        results[wire] = out
        error = np.abs(out.astype(np.float64) - exact)
        bound = RELATIVE[effective] * magnitude + FLOOR[effective] * magnitude.max()
        worst = int(np.argmax(error - bound))
        check(f"{label} {wire} within the {effective} bound",
              np.all(np.isfinite(out)) and np.all(error <= bound),
              f"[{worst}] got {out[worst]!r}, float64 sum {exact[worst]!r}, "
              f"bound {bound[worst]!r}")
        gathered = tfring.allgather(tf.constant(out[None, :])).numpy()
        check(f"{label} {wire} identical on every rank",
              all(np.array_equal(g, out) for g in gathered), "ranks differ")
    for wire in ("bf16", "fp16"):
        check(f"{label} {wire} was encoded across hosts",
              not np.array_equal(results[wire], results["none"])
              or JOB_DEFAULT == wire, "equal to the uncompressed sum")

print("RESULT " + json.dumps({"rank": rank, "data_path": tfring.data_path(),
                              "checks": checks, "failures": failures}),
      flush=True)
tfring.shutdown()
