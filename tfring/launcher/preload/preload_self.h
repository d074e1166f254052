// How a library that tfringrun preloads (tfring/launcher/preload/loopback_listeners.cc)
// takes itself out of LD_PRELOAD, so the programs its process starts
// (compilers, shells, helpers) do not load it too. The preloaded library
// depends on nothing of tfring's, hence a header of its own.
//
// Header only. The functions are hidden, so that they never resolve to a
// copy in another library; the caller passes the address of one of its own
// internal symbols, so dladdr names the preloaded library itself.
#ifndef TFRING_TFRING_PRELOAD_SELF_H_
#define TFRING_TFRING_PRELOAD_SELF_H_

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace tfring_preload {

// The path of the shared library that holds `any_symbol_in_this_library`,
// as the dynamic loader found it; "" when dladdr does not know it.
__attribute__((visibility("hidden"))) inline std::string OwnPath(
    const void* any_symbol_in_this_library) {
  Dl_info info;
  if (dladdr(any_symbol_in_this_library, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// `text` cut at any of `separators`, without empty parts.
__attribute__((visibility("hidden"))) inline std::vector<std::string> Split(
    const std::string& text, const char* separators) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find_first_of(separators, start);
    if (end == std::string::npos) end = text.size();
    if (end > start) parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// Rewrites LD_PRELOAD without the library that holds
// `any_symbol_in_this_library` (entries are separated by ':' or ' '; the
// others keep their order, joined by ':'), and unsets it when nothing is
// left. Does nothing when LD_PRELOAD is unset or the library's path is
// unknown.
__attribute__((visibility("hidden"))) inline void RemoveSelfFromPreload(
    const void* any_symbol_in_this_library) {
  const char* preload = std::getenv("LD_PRELOAD");
  const std::string self = OwnPath(any_symbol_in_this_library);
  if (preload == nullptr || self.empty()) return;
  std::string kept;
  for (const std::string& entry : Split(preload, ": ")) {
    if (entry != self) kept += (kept.empty() ? "" : ":") + entry;
  }
  if (kept.empty()) {
    unsetenv("LD_PRELOAD");
  } else {
    setenv("LD_PRELOAD", kept.c_str(), 1);
  }
}

}  // namespace tfring_preload

#endif  // TFRING_TFRING_PRELOAD_SELF_H_
