# Host discovery for elastic training (`--host-discovery-script`).
#
# Why: rank 0 alone runs the user's script (one `host:slots` line per
# usable host), in a background thread so training never waits for it, and
# turns a change into a plan: how many ranks to start on which host, and
# which hosts' ranks leave (hosts no longer listed). The plan reaches every
# rank at the next commit() (State.check_host_updates), where they all raise
# HostsUpdatedInterrupt together. Jobs without a script
# pay nothing: commit() then stays local.

import os
import subprocess
import sys
import threading
import time

SCRIPT = "TFRING_ELASTIC_DISCOVERY_SCRIPT"
SLOTS = "TFRING_ELASTIC_SLOTS"
INTERVAL = "TFRING_ELASTIC_DISCOVERY_INTERVAL"


def enabled():
    return bool(os.environ.get(SCRIPT))


def parse_hosts(text, default_slots):
    """{host: slots} from the script's output (`host` alone: default_slots)."""
    hosts = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, slots = line.partition(":")
        hosts[name] = int(slots) if slots else default_slots
    return hosts


def growth_plan(discovered, ranks_per_host, size, max_np):
    """[(host, ranks to start)] filling the free slots of discovered hosts,
    up to max_np ranks in all (0: no bound); in the order of the listing."""
    room = (max_np - size) if max_np else sum(discovered.values())
    plan = []
    for host, slots in discovered.items():
        free = min(slots - ranks_per_host.get(host, 0), room)
        if free > 0:
            plan.append((host, free))
            room -= free
    return plan


_warned_of_foreign_listing = False


def removed_hosts(discovered, ranks_per_host):
    """The hosts running ranks of the job that the listing no longer has,
    sorted; none when the listing has none of them: an empty or failing
    script, or host names other than the launch's, is likelier than every
    host going away at once, and removing them all would end the job with
    status 0 (warned once)."""
    global _warned_of_foreign_listing
    removed = sorted(host for host in ranks_per_host if host not in discovered)
    if removed and len(removed) == len(ranks_per_host):
        if not _warned_of_foreign_listing:
            print(f"tfring elastic: the host discovery script lists none of "
                  f"the job's hosts ({', '.join(removed)}); keeping their "
                  "ranks. It should print the names used in -H/--hostfile.",
                  file=sys.stderr, flush=True)
            _warned_of_foreign_listing = True
        return []
    return removed


class Discovery:
    """Rank 0's poller of the discovery script."""

    def __init__(self, script, default_slots, interval_s):
        self._script = script
        self._default_slots = default_slots
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._hosts = None
        self._thread = threading.Thread(target=self._poll, daemon=True,
                                        name="tfring-host-discovery")
        self._thread.start()

    def hosts(self):
        """The newest listing ({host: slots}), or None before the first."""
        with self._lock:
            return None if self._hosts is None else dict(self._hosts)

    def _poll(self):
        while True:
            try:
                output = subprocess.run(
                    [self._script], capture_output=True, text=True,
                    timeout=60, check=True).stdout
                hosts = parse_hosts(output, self._default_slots)
                with self._lock:
                    self._hosts = hosts
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                print(f"tfring elastic: the host discovery script "
                      f"{self._script} failed ({e}); keeping the last hosts "
                      "it listed.", file=sys.stderr, flush=True)
            time.sleep(self._interval_s)


def interval_s():
    """Seconds between two runs of the script."""
    return float(os.environ.get(INTERVAL, "") or 1.0)


_poller = None


def poller():
    """Rank 0's Discovery, started on first use; None without a script."""
    global _poller
    if _poller is None and enabled():
        _poller = Discovery(os.environ[SCRIPT],
                            int(os.environ.get(SLOTS, "") or 1),
                            interval_s())
    return _poller
