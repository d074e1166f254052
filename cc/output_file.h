// OpenOutputFile: how the core opens the files it writes at a path the user
// names (the timeline, the autotuner's log).
//
// Why not fopen(path, "w"): the suggested paths live in shared directories
// such as /tmp, where another user can plant a symbolic link (or a FIFO)
// under the name before the job starts; fopen would follow the link and a
// job run as root would overwrite the link's target, and it creates the file
// readable by every user (tensor names, timings). Here the last component of
// the path is never followed when it is a link, anything but a regular file
// is refused, and a new file is created with mode 0600 (this user only; the
// umask may remove more). An existing regular file is truncated and keeps
// its mode.
#ifndef TFRING_CC_OUTPUT_FILE_H_
#define TFRING_CC_OUTPUT_FILE_H_

#include <cstdio>
#include <string>

#include "cc/status.h"

namespace tfring {

// Opens `path` for writing as above. `what` names the file and the setting
// that chose it in errors, e.g. "tfring timeline (TFRING_TIMELINE)". On
// failure *file is null and the status says what to do.
Status OpenOutputFile(const std::string& path, const std::string& what, std::FILE** file);

}  // namespace tfring

#endif  // TFRING_CC_OUTPUT_FILE_H_
