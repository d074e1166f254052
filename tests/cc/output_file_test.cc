// Tests of OpenOutputFile (cc/output_file.h) and of the timeline's use of it
// (cc/timeline/timeline.h), in one process.
//
// What: a symbolic link at the path is refused (also a dangling one, which
// fopen would have created the target of), its target left untouched, with
// an error naming the path and the setting; a FIFO or a directory is refused
// without blocking; a new file is created 0600 whatever the umask allows;
// an existing regular file is truncated and keeps its mode; the timeline
// names the setting that chose the path.
//
// Usage: output_file_test <scenario|all|list> [scratch_dir] (default: a new
// directory under $TEST_TMPDIR, $TMPDIR or /tmp). Driven from
// tests/test_output_file.py.

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "cc/output_file.h"
#include "cc/timeline/timeline.h"
#include "tests/cc/expect.h"

namespace tfring {
namespace testing {
namespace {

std::string scratch_dir;

std::string ScratchPath(const std::string& name) { return scratch_dir + "/" + name; }

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

mode_t Mode(const std::string& path) {
  struct stat info;
  EXPECT_TRUE(lstat(path.c_str(), &info) == 0, "lstat " << path);
  return info.st_mode & 07777;
}

void ExpectRefused(const Status& status, std::FILE* file, const std::string& path,
                   const std::string& what, const std::string& why) {
  EXPECT_TRUE(!status.ok() && file == nullptr, path << " was opened");
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument &&
                  Contains(status.message(), what + ": ") &&
                  Contains(status.message(), "'" + path + "'") &&
                  Contains(status.message(), why),
              "expected '" << why << "' naming " << path << " and " << what << ", got: "
                           << status.message());
}

// A link planted at the path, to a file of the user's or to nowhere: refused
// (before, fopen truncated the target, or created the missing one).
void SymbolicLinkRefused() {
  const std::string target = ScratchPath("precious.txt");
  Write(target, "keep me\n");
  const std::string link = ScratchPath("timeline.json");
  EXPECT_TRUE(symlink(target.c_str(), link.c_str()) == 0, "symlink");
  std::FILE* file = nullptr;
  Status status = OpenOutputFile(link, "tfring timeline (TFRING_TIMELINE)", &file);
  ExpectRefused(status, file, link, "tfring timeline (TFRING_TIMELINE)",
                "is a symbolic link, and tfring does not write through one");
  EXPECT_TRUE(ReadAll(target) == "keep me\n", "the link's target changed: " << ReadAll(target));

  const std::string missing = ScratchPath("created_through_a_link.txt");
  const std::string dangling = ScratchPath("tune.csv");
  EXPECT_TRUE(symlink(missing.c_str(), dangling.c_str()) == 0, "symlink");
  status = OpenOutputFile(dangling, "tfring autotune log (TFRING_AUTOTUNE_LOG)", &file);
  ExpectRefused(status, file, dangling, "tfring autotune log (TFRING_AUTOTUNE_LOG)",
                "is a symbolic link");
  EXPECT_TRUE(access(missing.c_str(), F_OK) != 0, "created the dangling link's target");
}

// A FIFO (open for writing would wait for a reader) and a directory.
void NotARegularFileRefused() {
  const std::string fifo = ScratchPath("fifo");
  EXPECT_TRUE(mkfifo(fifo.c_str(), 0600) == 0, "mkfifo");
  const auto start = std::chrono::steady_clock::now();
  std::FILE* file = nullptr;
  Status status = OpenOutputFile(fifo, "tfring timeline (TFRING_TIMELINE)", &file);
  EXPECT_TRUE(std::chrono::steady_clock::now() - start < std::chrono::seconds(5),
              "opening a FIFO blocked");
  EXPECT_TRUE(!status.ok() && file == nullptr && Contains(status.message(), fifo),
              status.message());
  const std::string directory = ScratchPath("a_directory");
  EXPECT_TRUE(mkdir(directory.c_str(), 0700) == 0, "mkdir");
  status = OpenOutputFile(directory, "tfring timeline (TFRING_TIMELINE)", &file);
  EXPECT_TRUE(!status.ok() && file == nullptr && Contains(status.message(), directory),
              status.message());
  status = OpenOutputFile(ScratchPath("no_such_dir/t.json"), "tfring timeline (x)", &file);
  ExpectRefused(status, file, ScratchPath("no_such_dir/t.json"), "tfring timeline (x)",
                "cannot write");
}

// New files are this user's alone (before: 0644 under the usual umask);
// existing ones are truncated and keep their mode.
void NewFilesArePrivate() {
  const mode_t old_umask = umask(0);  // the most permissive umask
  const std::string path = ScratchPath("new.json");
  std::FILE* file = nullptr;
  Status status = OpenOutputFile(path, "tfring timeline (TFRING_TIMELINE)", &file);
  umask(old_umask);
  EXPECT_TRUE(status.ok() && file != nullptr, status.message());
  std::fputs("written\n", file);
  std::fclose(file);
  EXPECT_TRUE(Mode(path) == 0600, "a new file has mode " << std::oct << Mode(path));
  EXPECT_TRUE(ReadAll(path) == "written\n", ReadAll(path));

  const std::string existing = ScratchPath("existing.csv");
  Write(existing, "an old and longer content\n");
  chmod(existing.c_str(), 0640);
  status = OpenOutputFile(existing, "tfring autotune log (TFRING_AUTOTUNE_LOG)", &file);
  EXPECT_TRUE(status.ok() && file != nullptr, status.message());
  std::fputs("new\n", file);
  std::fclose(file);
  EXPECT_TRUE(ReadAll(existing) == "new\n", "not truncated: " << ReadAll(existing));
  EXPECT_TRUE(Mode(existing) == 0640, "mode changed to " << std::oct << Mode(existing));
}

// The timeline refuses a link with an error naming the setting that chose
// the path, and writes a new file 0600.
void TimelineNamesItsSetting() {
  const std::string target = ScratchPath("target.json");
  Write(target, "mine\n");
  const std::string link = ScratchPath("link.json");
  EXPECT_TRUE(symlink(target.c_str(), link.c_str()) == 0, "symlink");
  Timeline timeline;
  Status status = timeline.Start(link, false, 2, "HOROVOD_TIMELINE");
  EXPECT_TRUE(!status.ok() &&
                  Contains(status.message(), "tfring timeline (HOROVOD_TIMELINE): '" + link +
                                                 "' is a symbolic link"),
              status.message());
  EXPECT_TRUE(ReadAll(target) == "mine\n", "the link's target changed");
  const std::string path = ScratchPath("new_timeline.json");
  status = timeline.Start(path, false, 2, "tfring.start_timeline()");
  EXPECT_TRUE(status.ok(), status.message());
  timeline.Stop();
  EXPECT_TRUE((Mode(path) & 0077) == 0, "the timeline has mode " << std::oct << Mode(path));
  EXPECT_TRUE(Contains(ReadAll(path), "traceEvents"), ReadAll(path));
}

const std::map<std::string, std::function<void()>>& Scenarios() {
  static const auto* scenarios = new std::map<std::string, std::function<void()>>{
      {"symbolic_link_refused", SymbolicLinkRefused},
      {"not_a_regular_file_refused", NotARegularFileRefused},
      {"new_files_are_private", NewFilesArePrivate},
      {"timeline_names_its_setting", TimelineNamesItsSetting},
  };
  return *scenarios;
}

}  // namespace
}  // namespace testing
}  // namespace tfring

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s <scenario|all|list> [scratch_dir]\n", argv[0]);
    return 2;
  }
  if (argc == 3) {
    tfring::testing::scratch_dir = argv[2];
  } else {
    const char* tmp = std::getenv("TEST_TMPDIR");  // set by `bazel test`
    if (tmp == nullptr || *tmp == '\0') tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/output_file_testXXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      return 2;
    }
    tfring::testing::scratch_dir = pattern;
  }
  return tfring::testing::RunScenarios(tfring::testing::Scenarios(), argv[1], "",
                                       [](const auto& fn) { fn(); });
}
