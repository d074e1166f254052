#include "cc/job/cpu_binding.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "cc/logging.h"

#if defined(__linux__)
#include <dirent.h>
#include <sched.h>
#endif

namespace tfring {

std::vector<int> ChooseCpuShare(const std::vector<std::vector<int>>& allowed_by_local_rank,
                                int local_rank, const std::vector<CpuPlace>& places) {
  const int ranks = static_cast<int>(allowed_by_local_rank.size());
  if (ranks < 2 || local_rank < 0 || local_rank >= ranks) return {};
  const std::vector<int>& allowed = allowed_by_local_rank[local_rank];
  for (const std::vector<int>& other : allowed_by_local_rank) {
    if (other != allowed) return {};
  }
  const int cpus = static_cast<int>(allowed.size());
  if (cpus < ranks) return {};
  std::vector<CpuPlace> ordered;
  for (int cpu : allowed) {
    auto place = std::find_if(places.begin(), places.end(),
                              [cpu](const CpuPlace& p) { return p.cpu == cpu; });
    ordered.push_back(place != places.end() ? *place : CpuPlace{cpu, 0, cpu});
  }
  std::stable_sort(ordered.begin(), ordered.end(), [](const CpuPlace& a, const CpuPlace& b) {
    return std::tie(a.package, a.core, a.cpu) < std::tie(b.package, b.core, b.cpu);
  });
  const int64_t begin = static_cast<int64_t>(local_rank) * cpus / ranks;
  const int64_t end = static_cast<int64_t>(local_rank + 1) * cpus / ranks;
  std::vector<int> share;
  for (int64_t i = begin; i < end; ++i) share.push_back(ordered[i].cpu);
  std::sort(share.begin(), share.end());
  return share;
}

std::string CpuListToString(const std::vector<int>& cpus) {
  std::ostringstream text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    text << (i > 0 ? "," : "") << cpus[i];
    if (j > i) text << "-" << cpus[j];
    i = j + 1;
  }
  return text.str();
}

#if defined(__linux__)
namespace {

// One word per 64 CPUs of a cpu_set_t, for the exchange.
constexpr int kMaskWords = CPU_SETSIZE / 64;

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int64_t> ToMask(const std::vector<int>& cpus) {
  std::vector<int64_t> words(kMaskWords, 0);
  for (int cpu : cpus) {
    words[cpu / 64] = static_cast<int64_t>(static_cast<uint64_t>(words[cpu / 64]) |
                                           (uint64_t{1} << (cpu % 64)));
  }
  return words;
}

std::vector<int> FromMask(const int64_t* words) {
  std::vector<int> cpus;
  for (int cpu = 0; cpu < kMaskWords * 64; ++cpu) {
    if ((static_cast<uint64_t>(words[cpu / 64]) >> (cpu % 64)) & 1) cpus.push_back(cpu);
  }
  return cpus;
}

int ReadTopologyNumber(int cpu, const char* name, int fallback) {
  std::ifstream file("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" +
                     name);
  int value = fallback;
  if (!(file >> value)) return fallback;
  return value;
}

std::vector<CpuPlace> Places(const std::vector<int>& cpus) {
  std::vector<CpuPlace> places;
  for (int cpu : cpus) {
    places.push_back(CpuPlace{cpu, ReadTopologyNumber(cpu, "physical_package_id", 0),
                              ReadTopologyNumber(cpu, "core_id", cpu)});
  }
  return places;
}

// Binds every thread of this process (threads started later inherit the
// binding of the thread that starts them). Returns the first error number.
int BindAllThreads(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  int first_error = 0;
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) {
    return sched_setaffinity(0, sizeof(set), &set) == 0 ? 0 : errno;
  }
  while (dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    const pid_t thread = static_cast<pid_t>(std::atoi(entry->d_name));
    if (sched_setaffinity(thread, sizeof(set), &set) != 0 && first_error == 0 &&
        errno != ESRCH) {  // ESRCH: the thread ended meanwhile
      first_error = errno;
    }
  }
  closedir(tasks);
  return first_error;
}

}  // namespace

Status BindToCpuShare(Transport* host_ranks) {
  const std::vector<int> allowed = AllowedCpus();
  std::vector<int64_t> all_masks;
  TFRING_RETURN_IF_ERROR(host_ranks->AllgatherInt64s(ToMask(allowed), &all_masks));
  std::vector<std::vector<int>> allowed_by_local_rank;
  for (size_t at = 0; at + kMaskWords <= all_masks.size(); at += kMaskWords) {
    allowed_by_local_rank.push_back(FromMask(all_masks.data() + at));
  }
  const std::vector<int> share =
      ChooseCpuShare(allowed_by_local_rank, host_ranks->rank(), Places(allowed));
  if (share.empty()) return Status::OK();
  const int error = BindAllThreads(share);
  if (error != 0) {
    TFRING_LOG(kWarning, "could not bind this rank to CPUs " << CpuListToString(share)
                             << " (its share of " << CpuListToString(allowed) << " for "
                             << allowed_by_local_rank.size() << " ranks on this host): "
                             << std::strerror(error)
                             << ". The ranks run unbound; set TFRING_CPU_BINDING=0 to "
                                "silence this warning.");
    return Status::OK();
  }
  TFRING_LOG(kInfo, "bound to CPUs " << CpuListToString(share) << ", local rank "
                                     << host_ranks->rank() << "'s share of "
                                     << CpuListToString(allowed) << " (TFRING_CPU_BINDING=0 "
                                                                    "leaves ranks unbound)");
  return Status::OK();
}

#else

Status BindToCpuShare(Transport* host_ranks) {
  (void)host_ranks;
  return Status::OK();
}

#endif

}  // namespace tfring
