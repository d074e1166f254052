# Hosts whose ranks failed, kept out of an elastic job's growth for a while.
#
# Why: a rank that died often died of its host (a bad disk, a flaky
# network, memory taken by other work); starting a new rank there at the
# next commit would likely fail again. As in Horovod, a host where a rank
# died gets no new ranks: for good without --blacklist-cooldown-range, else
# for a cooldown that grows with each failure there (the lower limit times
# 2 to the number of failures, plus up to one lower limit at random, kept
# within the range); after it the host is usable again. Pure bookkeeping
# with an injectable clock, so it is tested without MPI.

import random
import time

COOLDOWN = "TFRING_ELASTIC_BLACKLIST_COOLDOWN"
# Horovod's bounds for the cooldown range, in seconds.
LOWEST_COOLDOWN_S = 1.0
HIGHEST_COOLDOWN_S = 3600.0


def check_cooldown_range(lower_s, upper_s):
    """Raises ValueError unless LOWEST <= lower_s <= upper_s <= HIGHEST."""
    if not LOWEST_COOLDOWN_S <= lower_s <= upper_s <= HIGHEST_COOLDOWN_S:
        raise ValueError(
            f"--blacklist-cooldown-range {lower_s:g} {upper_s:g} is out of "
            f"range. Expected {LOWEST_COOLDOWN_S:g} <= LO <= HI <= "
            f"{HIGHEST_COOLDOWN_S:g} seconds (Horovod's bounds). Fix the "
            "numbers.")


def cooldown_range_from_environment(environ):
    """(lower_s, upper_s) from COOLDOWN (`lo,hi`), or None: no cooldown
    (a blacklisted host stays out for good)."""
    text = environ.get(COOLDOWN, "").strip()
    if not text:
        return None
    try:
        lower_s, upper_s = (float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"tfring elastic: {COOLDOWN}={text!r} is not two numbers. "
            "Expected `LO,HI` in seconds (tfringrun sets it from "
            f"--blacklist-cooldown-range). Fix or unset {COOLDOWN}.") from None
    check_cooldown_range(lower_s, upper_s)
    return lower_s, upper_s


class HostBlacklist:
    """The hosts where ranks died, and until when each stays out."""

    def __init__(self, cooldown_range=None, clock=time.monotonic,
                 jitter=random.random):
        self._cooldown_range = cooldown_range
        self._clock = clock
        self._jitter = jitter
        self._failures = {}  # host: failures counted for its cooldown
        self._until = {}  # host: end of its cooldown (inf: for good)

    def add(self, host):
        """A rank on `host` died. A host still cooling down keeps its end."""
        now = self._clock()
        if self.is_blacklisted(host):
            return
        if self._cooldown_range is None:
            self._until[host] = float("inf")
            return
        lower_s, upper_s = self._cooldown_range
        failures = self._failures.get(host, 0) + 1
        self._failures[host] = failures
        delay_s = lower_s * (1 << failures) + self._jitter() * lower_s
        self._until[host] = now + max(lower_s, min(upper_s, delay_s))

    def is_blacklisted(self, host):
        return self._until.get(host, 0.0) > self._clock()

    def usable(self, hosts):
        """{host: slots} without the hosts blacklisted now."""
        return {host: slots for host, slots in hosts.items()
                if not self.is_blacklisted(host)}
