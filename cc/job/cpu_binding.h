// CPU binding: each rank of a host on its own share of the host's CPUs.
//
// Why: ranks launched without binding (tfringrun passes --bind-to none, so
// that a rank's TensorFlow thread pools are not squeezed onto one core)
// float over every CPU of the host. Their threads then take turns on each
// other's cores: one rank's background thread or TensorFlow pool wakes on
// the core where the other rank was computing, both lose their caches, and
// the rank that was pushed aside reaches the next allreduce late while the
// other waits. Measured with benchmarks/keras_scaling.py on 2 cores: 0.88
// of the no-communication ceiling unbound, 0.96 with each rank on its own
// core (the ceiling itself gained 2% from the same binding).
//
// How: at init the ranks of each host exchange the CPUs they may run on.
// When every one of them may run on the same set (nobody bound them
// individually: an mpirun binding, taskset or numactl per rank is kept) and
// the set has at least as many CPUs as the host has ranks, local rank i
// takes the i-th of as many contiguous shares, in an order that keeps the
// hardware threads of one core together, and binds every thread of its
// process to it. TensorFlow then sizes its default thread pools to the
// share. TFRING_CPU_BINDING=0 turns it off.
#ifndef TFRING_CC_JOB_CPU_BINDING_H_
#define TFRING_CC_JOB_CPU_BINDING_H_

#include <string>
#include <vector>

#include "cc/status.h"
#include "cc/transport.h"

namespace tfring {

// Where a CPU sits: its socket and core (sysfs topology).
struct CpuPlace {
  int cpu = 0;
  int package = 0;
  int core = 0;
};

// The CPUs local rank `local_rank` should bind to, given the CPUs each local
// rank may run on (`allowed_by_local_rank`, each sorted) and where each of
// those CPUs sits: empty (leave the binding as it is) when the ranks' sets
// differ, when there are fewer CPUs than ranks, or when the host runs one
// rank. Shares are contiguous in (package, core, cpu) order; their sizes
// differ by at most one CPU.
std::vector<int> ChooseCpuShare(const std::vector<std::vector<int>>& allowed_by_local_rank,
                                int local_rank, const std::vector<CpuPlace>& places);

// "0-3,8,10-11": a sorted CPU list as Linux's cpulist files print it.
std::string CpuListToString(const std::vector<int>& cpus);

// Collective over `host_ranks` (this host's ranks, in local rank order):
// binds this process to its share as described above, and logs the share at
// info level. Failing to bind (no permission) is logged and is not an error;
// only the exchange can fail.
Status BindToCpuShare(Transport* host_ranks);

}  // namespace tfring

#endif  // TFRING_CC_JOB_CPU_BINDING_H_
