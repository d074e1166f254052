# A job that points the timeline at paths another user could have planted:
# TFRING_TIMELINE (or HOROVOD_TIMELINE) and tfring.start_timeline(argv[1])
# are symbolic links; argv[2] is a fresh path. Prints what happened, for
# tests/test_tuning_and_timeline_jobs.py. Needs neither TensorFlow nor torch.
import os
import sys

import tfring

link, fresh = sys.argv[1], sys.argv[2]
tfring.init()
try:
    tfring.start_timeline(link)
    print("STARTED_THROUGH_LINK", flush=True)
except ValueError as e:
    print(f"REFUSED {e}", flush=True)
tfring.start_timeline(fresh)
tfring.stop_timeline()
print(f"MODE {os.stat(fresh).st_mode & 0o777:o}", flush=True)
tfring.shutdown()
