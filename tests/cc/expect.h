// The check macro of the C++ tests and the runner they share: a failed
// EXPECT_TRUE throws TestFailure with file:line, the condition and a
// message; RunScenarios catches it per scenario, prints FAIL and carries on.
#ifndef TFRING_TESTS_CC_EXPECT_H_
#define TFRING_TESTS_CC_EXPECT_H_

#include <cstdio>
#include <sstream>
#include <string>

namespace tfring {
namespace testing {

struct TestFailure {
  std::string message;
};

#define EXPECT_TRUE(condition, stream_expr)                                             \
  do {                                                                                  \
    if (!(condition)) {                                                                 \
      std::ostringstream _out;                                                          \
      _out << __FILE__ << ":" << __LINE__ << ": " << #condition << ": " << stream_expr; \
      throw ::tfring::testing::TestFailure{_out.str()};                                 \
    }                                                                                   \
  } while (0)

// Runs the scenario named `which` ("all": every one; "list": prints the
// names) of `scenarios` (name -> what `run` takes), printing
// "PASS <name><suffix>" or "FAIL <name><suffix>: why". Returns the exit
// code: 0 all passed, 1 some failed, 2 no such scenario.
template <typename Scenarios, typename Run>
int RunScenarios(const Scenarios& scenarios, const std::string& which,
                 const std::string& suffix, Run run) {
  if (which == "list") {
    for (const auto& [name, fn] : scenarios) std::printf("%s\n", name.c_str());
    return 0;
  }
  int failed = 0, ran = 0;
  for (const auto& [name, fn] : scenarios) {
    if (which != "all" && which != name) continue;
    ++ran;
    try {
      run(fn);
      std::printf("PASS %s%s\n", name.c_str(), suffix.c_str());
    } catch (const TestFailure& failure) {
      ++failed;
      std::printf("FAIL %s%s: %s\n", name.c_str(), suffix.c_str(), failure.message.c_str());
    }
    std::fflush(stdout);
  }
  if (ran == 0) {
    std::fprintf(stderr, "unknown scenario '%s'\n", which.c_str());
    return 2;
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace testing
}  // namespace tfring

#endif  // TFRING_TESTS_CC_EXPECT_H_
