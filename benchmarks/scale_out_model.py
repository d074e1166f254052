"""The alpha-beta model of docs/scale-out.md: predicted time of one ResNet-50
gradient allreduce at 8 to 1024 hosts of 8 ranks, for the ring, the
hierarchical path, bf16 wire compression and PowerSGD.

    python benchmarks/scale_out_model.py            # the page's tables (markdown)
    python benchmarks/scale_out_model.py --check    # the model at 2 hosts x 2 ranks, 1 Gbit/s

The figures it starts from (FIGURES below) are measured on this project's
benchmark machine (docs/benchmarks.md, docs/compression.md); the network
rates are the model's parameter. No TensorFlow needed: the ResNet-50
gradient set's payloads are fixed below (from keras.applications.ResNet50's
214 trainable variables).
"""

import argparse
import math

# Measured (2-core Xeon, namespace hosts; see docs/scale-out.md):
FIGURES = {
    # One message between hosts (raw MPI's lone 4 KiB allreduce across two
    # namespace hosts, 0.02 ms, is two messages).
    "alpha_cross_s": 10e-6,
    # tfring's fixed cost per fused allreduce (negotiation and the op around
    # the transfer: a lone 4 KiB allreduce across hosts, 0.14 ms, minus the
    # two messages).
    "overhead_s": 0.12e-3,
    # Per byte reduced inside a host through shared memory (a 64 MiB
    # allreduce of 2 ranks in a tf.function: 6.0 ms).
    "beta_local_s_per_byte": 6.0e-3 / (64 * 2 ** 20),
    # Per value encoded or decoded (bf16) on one core.
    "codec_s_per_value": 0.5e-9,
}

# The ResNet-50 gradient set: float32 values in all, and what PowerSGD
# sends per rank r (sum over compressed matrices of (n + m) r, plus the
# values of the tensors it leaves uncompressed), computed from the shapes.
RESNET50_VALUES = 25_583_592
POWERSGD_VALUES = {1: 163_171, 4: 410_644, 16: 1_402_584}
HOST_COUNTS = (8, 32, 128, 1024)
RATES_GBIT = (25, 100, 400)
RANKS_PER_HOST = 8


def ring(nodes, payload_bytes, rate_bytes_s, alpha):
    """A bandwidth-optimal ring allreduce over `nodes` with one link each."""
    if nodes == 1:
        return 0.0
    return 2 * (nodes - 1) * alpha + 2 * (nodes - 1) / nodes * payload_bytes / rate_bytes_s


def halving_doubling(nodes, payload_bytes, rate_bytes_s, alpha):
    """Recursive halving then doubling (MPI's choice for small payloads):
    2 log2(N) messages, the same bytes as the ring."""
    if nodes == 1:
        return 0.0
    return (2 * math.ceil(math.log2(nodes)) * alpha
            + 2 * (nodes - 1) / nodes * payload_bytes / rate_bytes_s)


def predict(hosts, rate_gbit, ranks_per_host=RANKS_PER_HOST, figures=FIGURES):
    """{method: seconds} for one allreduce of the ResNet-50 set."""
    f = figures
    rate = rate_gbit * 1e9 / 8
    size = 4 * RESNET50_VALUES
    ranks = hosts * ranks_per_host
    local = 2 * size * f["beta_local_s_per_byte"] if ranks_per_host > 1 else 0.0
    # Flat ring over every rank, ranks of a host consecutive: each host's
    # link carries one ring edge each way, so it moves 2 (N-1)/N of the set,
    # but every one of the 2 (N-1) steps pays a message's latency.
    flat = f["overhead_s"] + ring(ranks, size, rate, f["alpha_cross_s"])
    # Hierarchical: float32 inside the host, then one ring per local rank on
    # 1/8 of the set; the 8 rings share the host's link.
    cross = ring(hosts, size / ranks_per_host, rate / ranks_per_host, f["alpha_cross_s"])
    hierarchical = f["overhead_s"] + local + cross
    # bf16 wire: half the bytes across; each value encoded and decoded twice
    # on its rank's 1/8 slice.
    codec = 4 * RESNET50_VALUES / ranks_per_host * f["codec_s_per_value"]
    bf16 = f["overhead_s"] + local + codec + ring(
        hosts, size / 2 / ranks_per_host, rate / ranks_per_host, f["alpha_cross_s"])
    out = {"flat ring (fp32)": flat, "hierarchical (fp32)": hierarchical,
           "hierarchical + bf16 wire": bf16}
    for r, values in POWERSGD_VALUES.items():
        # Two allreduce rounds (P with the uncompressed tensors, then Q),
        # each of about half the payload, small enough for recursive
        # halving/doubling over every rank; the matrix products are not
        # counted (on a GPU they take well under a millisecond).
        out[f"PowerSGD r={r}"] = 2 * f["overhead_s"] + 2 * halving_doubling(
            ranks, 4 * values / 2, rate, f["alpha_cross_s"])
    return out


def table():
    lines = []
    for rate in RATES_GBIT:
        methods = list(predict(HOST_COUNTS[0], rate))
        lines.append(f"\n{rate} Gbit/s per host, ms per allreduce of the ResNet-50 set:\n")
        lines.append("| method | " + " | ".join(f"{h} hosts" for h in HOST_COUNTS) + " |")
        lines.append("|---|" + "---:|" * len(HOST_COUNTS))
        for method in methods:
            cells = [f"{predict(h, rate)[method] * 1e3:.1f}" for h in HOST_COUNTS]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="the model at 2 hosts x 2 ranks, 1 Gbit/s")
    args = parser.parse_args()
    if args.check:
        for method, seconds in predict(2, 1, ranks_per_host=2).items():
            print(f"{method:<28} {seconds * 1e3:8.1f} ms")
        return
    print(table())


if __name__ == "__main__":
    main()
