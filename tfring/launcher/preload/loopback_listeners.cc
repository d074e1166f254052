// libtfring_loopback_listeners.so: keeps Open MPI's listening sockets off
// the addresses a tfring job does not use.
//
// Why: Open MPI 5 binds its listeners to the wildcard address (0.0.0.0 and
// [::]), whatever its interface options say: mpirun's daemon channel
// (PRRTE 3's prterun, and prted on other hosts) and each rank's TCP
// transport. The options only choose which addresses are advertised and
// used. tfringrun preloads this library (LD_PRELOAD) to turn those wildcard
// binds into binds to the addresses the job uses, same family and port:
//
//  - one-host jobs (TFRING_LISTEN_ON unset): in prterun only, to loopback.
//    No daemon ever connects to mpirun's channel there, and the ranks use
//    no TCP at all.
//  - jobs on several hosts with --network-interface (TFRING_LISTEN_ON set
//    to the same interface names or CIDR subnets): in prterun and prted,
//    and in the ranks for binds made by Open MPI's own libraries (libmpi,
//    libopen-pal, libprrte, libpmix), to this host's first address of that
//    family on a listed interface (loopback when there is none, so nothing
//    listens where it is not asked to). A server in the user's script binds
//    where it asks.
//
// In prterun and prted the library removes itself from LD_PRELOAD as they
// start, so what they start does not load it unless tfringrun forwards it
// (it does so to the ranks of a multi-host job, with -x).
//
// Linux only (it reads /proc/self/exe); no tfring dependency, built by
// setup.py next to the other native libraries.

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tfring/launcher/preload/preload_self.h"

namespace {

using BindFunction = int (*)(int, const sockaddr*, socklen_t);

enum class Process { kOther, kLauncher, kRank };

// Set once, before main, by the constructor below.
Process process = Process::kOther;

// TFRING_LISTEN_ON split at commas; empty means "loopback". A function
// static: the constructor below may run before this file's globals are
// initialised.
std::vector<std::string>& ListenOn() {
  static std::vector<std::string>* listen_on = new std::vector<std::string>();
  return *listen_on;
}

std::string ExecutableName() {
  char exe[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (length <= 0) return "";
  exe[length] = '\0';
  const char* slash = std::strrchr(exe, '/');
  return slash == nullptr ? exe : slash + 1;
}

__attribute__((constructor)) void Start() {
  const std::string name = ExecutableName();
  const char* spec = std::getenv("TFRING_LISTEN_ON");
  if (spec != nullptr) ListenOn() = tfring_preload::Split(spec, ",");
  if (name == "prterun" || name == "prted") {
    // A one-host job has no prted; its prterun binds to loopback.
    process = Process::kLauncher;
    tfring_preload::RemoveSelfFromPreload(reinterpret_cast<const void*>(&Start));
  } else if (spec != nullptr) {
    process = Process::kRank;  // or anything a rank starts
  }
}

// Whether the code that called bind() belongs to Open MPI, PRRTE or PMIx.
bool CalledByMpi(const void* caller) {
  Dl_info info;
  if (caller == nullptr || dladdr(caller, &info) == 0 || info.dli_fname == nullptr) return false;
  const char* slash = std::strrchr(info.dli_fname, '/');
  const std::string library = slash == nullptr ? info.dli_fname : slash + 1;
  for (const char* prefix : {"libmpi.", "libopen-pal.", "libprrte.", "libpmix.", "libopen-rte."}) {
    if (library.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Whether `address` (of `family`) lies on one of the listed interfaces: an
// interface name, or a subnet in CIDR notation.
bool Listed(const char* interface_name, int family, const void* address) {
  for (const std::string& entry : ListenOn()) {
    const size_t slash = entry.find('/');
    if (slash == std::string::npos) {
      if (entry == interface_name) return true;
      continue;
    }
    const std::string base = entry.substr(0, slash);
    const int bits = std::atoi(entry.c_str() + slash + 1);
    unsigned char network[16];
    if (inet_pton(family, base.c_str(), network) != 1) continue;
    const int bytes = family == AF_INET ? 4 : 16;
    const unsigned char* candidate = static_cast<const unsigned char*>(address);
    bool match = bits >= 0 && bits <= bytes * 8;
    for (int bit = 0; match && bit < bits; ++bit) {
      const unsigned char mask = static_cast<unsigned char>(0x80 >> (bit % 8));
      match = (network[bit / 8] & mask) == (candidate[bit / 8] & mask);
    }
    if (match) return true;
  }
  return false;
}

// This host's first address of `family` on a listed interface, into
// `address` (an in_addr or in6_addr); false when there is none.
bool ListedAddress(int family, void* address) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return false;
  bool found = false;
  for (ifaddrs* entry = all; entry != nullptr && !found; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != family) continue;
    const void* candidate =
        family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(entry->ifa_addr)->sin6_addr);
    // A link-local IPv6 address needs a scope to bind to; MPI does not use them.
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(static_cast<const in6_addr*>(candidate))) {
      continue;
    }
    if (Listed(entry->ifa_name, family, candidate)) {
      std::memcpy(address, candidate, family == AF_INET ? sizeof(in_addr) : sizeof(in6_addr));
      found = true;
    }
  }
  freeifaddrs(all);
  return found;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int bind(int fd, const sockaddr* address,
                                                           socklen_t length) {
  static const BindFunction real_bind =
      reinterpret_cast<BindFunction>(dlsym(RTLD_NEXT, "bind"));
  const bool rewrite =
      address != nullptr &&
      (process == Process::kLauncher ||
       (process == Process::kRank && CalledByMpi(__builtin_return_address(0))));
  if (rewrite && address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
    sockaddr_in chosen;
    std::memcpy(&chosen, address, sizeof(chosen));
    if (chosen.sin_addr.s_addr == htonl(INADDR_ANY)) {
      if (ListenOn().empty() || !ListedAddress(AF_INET, &chosen.sin_addr)) {
        chosen.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      }
      return real_bind(fd, reinterpret_cast<const sockaddr*>(&chosen), sizeof(chosen));
    }
  } else if (rewrite && address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
    sockaddr_in6 chosen;
    std::memcpy(&chosen, address, sizeof(chosen));
    if (std::memcmp(&chosen.sin6_addr, &in6addr_any, sizeof(in6_addr)) == 0) {
      if (ListenOn().empty() || !ListedAddress(AF_INET6, &chosen.sin6_addr)) {
        chosen.sin6_addr = in6addr_loopback;
      }
      return real_bind(fd, reinterpret_cast<const sockaddr*>(&chosen), sizeof(chosen));
    }
  }
  return real_bind(fd, address, length);
}
