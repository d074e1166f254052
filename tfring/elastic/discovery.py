# Host discovery for elastic training (`--host-discovery-script`).
#
# Why a module of its own: the state's commit() asks it whether host
# changes can happen at all, so a job without a discovery script pays
# nothing for them. Growth onto discovered hosts is not available yet: a
# job started without a discovery script never changes hosts except by
# losing them.

import os

DISCOVERY_SCRIPT = "TFRING_ELASTIC_DISCOVERY_SCRIPT"


def enabled():
    return bool(os.environ.get(DISCOVERY_SCRIPT))
