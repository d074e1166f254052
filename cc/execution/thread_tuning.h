// How the background thread asks the OS to schedule it.
//
// Why: the background thread sleeps most of the time and, when it wakes,
// stands between a tensor and every rank's progress (a negotiation round
// completes only when every rank's thread has run it). On a busy host the
// cores run TensorFlow's threads, and by default a waking thread may wait
// for the running one's whole time slice (milliseconds) and its short naps
// are stretched by the timer slack (50 us by default). The thread asks for
// a short time slice, so that it preempts on waking but never runs long
// (Linux 6.12+ EEVDF; ignored elsewhere), and for a small timer slack, so
// that naps last as long as asked. Neither needs privileges; failures are
// ignored (the thread then runs as before).
#ifndef TFRING_CC_EXECUTION_THREAD_TUNING_H_
#define TFRING_CC_EXECUTION_THREAD_TUNING_H_

namespace tfring {

// Applies the above to the calling thread.
void TuneLatencySensitiveThread();

}  // namespace tfring

#endif  // TFRING_CC_EXECUTION_THREAD_TUNING_H_
