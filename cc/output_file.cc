#include "cc/output_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace tfring {

Status OpenOutputFile(const std::string& path, const std::string& what, std::FILE** file) {
  *file = nullptr;
  // O_NONBLOCK: opening a FIFO for writing would otherwise wait for a
  // reader; it is refused below either way.
  const int fd = open(path.c_str(),
                      O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    if (error == ELOOP) {
      return Status::InvalidArgument(
          what + ": '" + path + "' is a symbolic link, and tfring does not write through one "
          "(whoever can create a link there could aim it at any file this job may write). "
          "Remove the link, or give a path in a directory only you can write, e.g. under "
          "your home directory.");
    }
    return Status::InvalidArgument(what + ": cannot write '" + path + "' (" +
                                   std::strerror(error) +
                                   "). Give a path in an existing writable directory, one "
                                   "only you can write (e.g. under your home directory).");
  }
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    return Status::InvalidArgument(
        what + ": '" + path + "' is not a regular file (a FIFO, a device or a directory), "
        "and tfring writes only to regular files. Give the path of a new or regular file.");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  *file = fdopen(fd, "w");
  if (*file == nullptr) {
    const int error = errno;
    close(fd);
    return Status::InvalidArgument(what + ": cannot write '" + path + "' (" +
                                   std::strerror(error) + ").");
  }
  return Status::OK();
}

}  // namespace tfring
