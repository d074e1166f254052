// Job-wide configuration: at init every rank adopts rank 0's values of the
// knobs declared with scope kJob in config.h.
//
// Why: each rank reads TFRING_* from its own environment, and launchers do
// not forward variables to every rank by default (plain mpirun without -x,
// srun, a variable exported in one rank's shell). A fusion threshold, direct
// threshold or cache capacity that differs between ranks makes them issue
// collective calls of different counts and sizes: undefined behaviour in MPI
// (seen as hangs and truncation errors). One broadcast at init removes the
// whole class of bugs; a rank whose own setting differed says so.
#ifndef TFRING_CC_JOB_JOB_CONFIG_H_
#define TFRING_CC_JOB_JOB_CONFIG_H_

#include "cc/config.h"
#include "cc/status.h"
#include "cc/transport.h"

namespace tfring {

// Collective over `transport`: replaces this rank's job-wide knobs in
// `config` with rank 0's and logs a warning naming each knob whose local
// value differed, with both values.
Status AdoptRootJobConfig(Transport* transport, Config* config);

}  // namespace tfring

#endif  // TFRING_CC_JOB_JOB_CONFIG_H_
