// The check macro of the C++ tests: a failed EXPECT_TRUE throws TestFailure
// with file:line, the condition and a message, caught per scenario by each
// test binary's runner (which prints FAIL and carries on).
#ifndef TFRING_TESTS_CC_EXPECT_H_
#define TFRING_TESTS_CC_EXPECT_H_

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

}  // namespace testing
}  // namespace tfring

#endif  // TFRING_TESTS_CC_EXPECT_H_
