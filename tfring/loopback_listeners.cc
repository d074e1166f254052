// libtfring_loopback_listeners.so: keeps mpirun's listening sockets on
// loopback in a job whose ranks all run on this host.
//
// Why: tfringrun leaves Open MPI's TCP transport out of one-host jobs, so the
// ranks open no port, but mpirun itself (PRRTE 3's prterun) binds its daemon
// channel to the wildcard address (0.0.0.0 and [::]), whatever its interface
// options say, and refuses loopback as its only interface. In a one-host job
// no daemon ever connects to that channel, so tfringrun preloads this library
// into mpirun (LD_PRELOAD) and, in prterun only, a bind() to the wildcard
// address becomes a bind() to the loopback address of the same family and
// port. Every other process, and every other bind(), is left alone.
//
// The library removes itself from LD_PRELOAD as prterun starts, so the
// ranks (and anything else prterun starts) never load it: a server in the
// user's script still binds where it asks.
//
// Linux only (it reads /proc/self/exe); framework-neutral C++ with no tfring
// dependency, built by setup.py next to the other native libraries.

#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using BindFunction = int (*)(int, const sockaddr*, socklen_t);

// Set once, before main, by the constructor below.
bool rewrite_binds = false;

bool IsPrterun() {
  char exe[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (length <= 0) return false;
  exe[length] = '\0';
  const char* slash = std::strrchr(exe, '/');
  return std::strcmp(slash == nullptr ? exe : slash + 1, "prterun") == 0;
}

// This library's own path, as the dynamic loader found it.
std::string OwnPath() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OwnPath), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  return info.dli_fname;
}

// LD_PRELOAD without this library (entries are separated by ':' or ' ').
void RemoveSelfFromPreload() {
  const char* preload = std::getenv("LD_PRELOAD");
  const std::string self = OwnPath();
  if (preload == nullptr || self.empty()) return;
  std::string kept;
  const std::string all = preload;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find_first_of(": ", start);
    if (end == std::string::npos) end = all.size();
    const std::string entry = all.substr(start, end - start);
    if (!entry.empty() && entry != self) kept += (kept.empty() ? "" : ":") + entry;
    start = end + 1;
  }
  if (kept.empty()) {
    unsetenv("LD_PRELOAD");
  } else {
    setenv("LD_PRELOAD", kept.c_str(), 1);
  }
}

__attribute__((constructor)) void StartInPrterunOnly() {
  if (!IsPrterun()) return;
  rewrite_binds = true;
  RemoveSelfFromPreload();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int bind(int fd, const sockaddr* address,
                                                           socklen_t length) {
  static const BindFunction real_bind =
      reinterpret_cast<BindFunction>(dlsym(RTLD_NEXT, "bind"));
  if (rewrite_binds && address != nullptr) {
    if (address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
      sockaddr_in loopback;
      std::memcpy(&loopback, address, sizeof(loopback));
      if (loopback.sin_addr.s_addr == htonl(INADDR_ANY)) {
        loopback.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return real_bind(fd, reinterpret_cast<const sockaddr*>(&loopback), sizeof(loopback));
      }
    } else if (address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
      sockaddr_in6 loopback;
      std::memcpy(&loopback, address, sizeof(loopback));
      if (std::memcmp(&loopback.sin6_addr, &in6addr_any, sizeof(in6_addr)) == 0) {
        loopback.sin6_addr = in6addr_loopback;
        return real_bind(fd, reinterpret_cast<const sockaddr*>(&loopback), sizeof(loopback));
      }
    }
  }
  return real_bind(fd, address, length);
}
