#include "cc/shm/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

namespace tfring {
namespace {

constexpr char kShmDirectory[] = "/dev/shm";

std::string ErrnoText(int error) { return std::string(std::strerror(error)); }

std::string MiB(double bytes) {
  std::ostringstream text;
  text.precision(1);
  text << std::fixed << bytes / (1024.0 * 1024.0) << " MiB";
  return text.str();
}

// " (/dev/shm has 12.0 MiB free of 64.0 MiB)", or "" when statvfs fails.
std::string ShmSpaceText() {
  struct statvfs info;
  if (statvfs(kShmDirectory, &info) != 0) return "";
  const double free_bytes = static_cast<double>(info.f_bavail) * info.f_frsize;
  const double total_bytes = static_cast<double>(info.f_blocks) * info.f_frsize;
  return " (" + std::string(kShmDirectory) + " has " + MiB(free_bytes) + " free of " +
         MiB(total_bytes) + ")";
}

Status TooSmall(const std::string& name, size_t bytes, int error) {
  return Status::ResourceExhausted(
      "cannot reserve " + std::to_string(bytes) + " bytes (" + MiB(bytes) +
      ") of shared memory for segment " + name + ": " + ErrnoText(error) + ShmSpaceText() +
      ". Set a smaller TFRING_SHM_BYTES, or give the host a larger /dev/shm (e.g. "
      "docker run --shm-size=1g).");
}

Status CheckName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 255) {
    return Status::InvalidArgument("shared-memory segment name '" + name +
                                   "' must be '/' followed by 1 to 254 characters, "
                                   "none of them '/'");
  }
  return Status::OK();
}

Status Map(int fd, const std::string& name, size_t bytes, void** data) {
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (mapped == MAP_FAILED) {
    const int error = errno;
    return Status::ResourceExhausted("cannot map " + std::to_string(bytes) +
                                     " bytes of shared-memory segment " + name + ": " +
                                     ErrnoText(error));
  }
  *data = mapped;
  return Status::OK();
}

}  // namespace

Status ShmSegment::Create(const std::string& name, size_t bytes,
                          std::unique_ptr<ShmSegment>* segment) {
  TFRING_RETURN_IF_ERROR(CheckName(name));
  if (bytes == 0) {
    return Status::InvalidArgument("shared-memory segment " + name + " of 0 bytes");
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    const int error = errno;
    if (error == EEXIST) {
      return Status::FailedPrecondition(
          "shared-memory segment " + name + " already exists: another job uses the same "
          "name, or a crashed one left it behind (remove " + kShmDirectory + name + ")");
    }
    return Status::InvalidArgument("cannot create shared-memory segment " + name + ": " +
                                   ErrnoText(error));
  }
  // Everything below undoes the creation on failure.
  auto fail = [&](Status status) {
    close(fd);
    shm_unlink(name.c_str());
    return status;
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail(TooSmall(name, bytes, errno));
  // tmpfs hands out pages lazily; reserving them now turns a full /dev/shm
  // into this error instead of a SIGBUS on first touch.
  const int reserve_error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (reserve_error != 0) return fail(TooSmall(name, bytes, reserve_error));
  void* data = nullptr;
  Status mapped = Map(fd, name, bytes, &data);
  if (!mapped.ok()) return fail(mapped);
  close(fd);  // the mapping keeps the memory
  segment->reset(new ShmSegment(name, data, bytes, /*created=*/true));
  return Status::OK();
}

Status ShmSegment::Open(const std::string& name, size_t bytes,
                        std::unique_ptr<ShmSegment>* segment) {
  TFRING_RETURN_IF_ERROR(CheckName(name));
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return Status::FailedPrecondition(
          "shared-memory segment " + name + " does not exist: it must be created by one "
          "local rank before the others open it, and opened before it is unlinked");
    }
    return Status::InvalidArgument("cannot open shared-memory segment " + name + ": " +
                                   ErrnoText(error));
  }
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return Status::Internal("cannot stat shared-memory segment " + name + ": " +
                            ErrnoText(error));
  }
  if (static_cast<size_t>(info.st_size) < bytes) {
    close(fd);
    return Status::InvalidArgument("shared-memory segment " + name + " holds " +
                                   std::to_string(info.st_size) + " bytes, " +
                                   std::to_string(bytes) + " expected");
  }
  void* data = nullptr;
  Status mapped = Map(fd, name, bytes, &data);
  close(fd);
  TFRING_RETURN_IF_ERROR(mapped);
  segment->reset(new ShmSegment(name, data, bytes, /*created=*/false));
  return Status::OK();
}

ShmSegment::~ShmSegment() {
  munmap(data_, size_);
  if (created_ && !unlinked_) shm_unlink(name_.c_str());
}

Status ShmSegment::Unlink() {
  if (unlinked_) return Status::OK();
  unlinked_ = true;
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    const int error = errno;
    return Status::Internal("cannot unlink shared-memory segment " + name_ + ": " +
                            ErrnoText(error));
  }
  return Status::OK();
}

}  // namespace tfring
