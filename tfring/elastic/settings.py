# Elastic training's settings, as the launcher passes them to every rank.
#
# Why: `tfringrun --min-np/--max-np/--reset-limit/...` decides them once for
# the job; the ranks read them from their environment here, typed and with
# Horovod's defaults, and nowhere else.

import dataclasses
import os

ELASTIC = "TFRING_ELASTIC"
MIN_NP = "TFRING_ELASTIC_MIN_NP"
MAX_NP = "TFRING_ELASTIC_MAX_NP"
RESET_LIMIT = "TFRING_ELASTIC_RESET_LIMIT"
TIMEOUT = "TFRING_ELASTIC_TIMEOUT"
SPAWN_TIMEOUT = "TFRING_ELASTIC_SPAWN_TIMEOUT"
# How many times tfringrun started the job again after PRRTE ended it on
# losing a host's daemon (tfring/launcher/restart.py); 0 at first.
RESTARTS = "TFRING_ELASTIC_RESTARTS"
# Where each host keeps its newest commit for such a restart
# (tfring/elastic/kept_commit.py); empty: in memory only.
COMMIT_DIR = "TFRING_ELASTIC_COMMIT_DIR"
# Seconds ranks started into the job get to join it: Python, mpi4py and
# tfring start in a few seconds here, but a loaded host needs far more.
DEFAULT_SPAWN_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Settings:
    enabled: bool = False
    min_np: int = 1
    max_np: int = 0  # 0: no upper bound
    reset_limit: int = 0  # 0: no limit
    timeout_s: float = 600.0
    spawn_timeout_s: float = DEFAULT_SPAWN_TIMEOUT_S
    restarts: int = 0
    commit_dir: str = ""


def _int(environ, name, default):
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"tfring elastic: {name}={text!r} is not an integer. Expected a "
            f"whole number (tfringrun sets it from its options). Fix or unset "
            f"{name}.") from None


def _seconds(environ, name, default, zero_allowed=False):
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if zero_allowed and 0 <= value < float("inf"):
        return value
    if not zero_allowed and 0 < value < float("inf"):
        return value
    fix = (f"Expected e.g. 120 (tfringrun sets it from its options). Fix or "
           f"unset {name}.")
    if zero_allowed:
        raise ValueError(f"tfring elastic: {name}={text!r} is not a "
                         f"non-negative number of seconds. {fix}")
    raise ValueError(f"tfring elastic: {name}={text!r} is not a positive "
                     f"number of seconds. {fix}")


def from_environment(environ=None):
    environ = os.environ if environ is None else environ
    return Settings(
        enabled=environ.get(ELASTIC, "") == "1",
        min_np=_int(environ, MIN_NP, 1),
        max_np=_int(environ, MAX_NP, 0),
        reset_limit=_int(environ, RESET_LIMIT, 0),
        # 0 is a choice: below --min-np, end at once even with a script.
        timeout_s=_seconds(environ, TIMEOUT, 600.0, zero_allowed=True),
        spawn_timeout_s=_seconds(environ, SPAWN_TIMEOUT,
                                 DEFAULT_SPAWN_TIMEOUT_S),
        restarts=_int(environ, RESTARTS, 0),
        commit_dir=environ.get(COMMIT_DIR, "").strip(),
    )
