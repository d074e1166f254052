# The hosts of a job: `-H node1:2,node2:2` and mpirun hostfiles read into
# Host entries, and written back as an `-H` value.
#
# Why a module of its own: the mpirun command (command.py), the checks
# (checks.py), the elastic options (elastic.py) and a restart without a lost
# host (restart.py) all speak of hosts and slots; here is the one place that
# reads and writes them.

import dataclasses


class HostListError(ValueError):
    """A host list or hostfile tfringrun cannot read; the message says why."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int = None  # None: not given (mpirun decides)


def _slots(text, where, example):
    try:
        slots = int(text)
    except ValueError:
        slots = 0
    if slots < 1:
        raise HostListError(
            f"{where} gives {text!r} slots. Expected a positive whole number "
            f"of slots, e.g. {example}.")
    return slots


def parse_host_list(text):
    """Hosts of an `-H` value such as "node1:2,node2:2" (slots optional)."""
    hosts = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, colon, slots = entry.partition(":")
        if not name:
            raise HostListError(
                f"-H {text}: the entry {entry!r} has no host name. Expected "
                f"host or host:slots entries separated by commas, e.g. "
                f"-H node1:2,node2:2.")
        hosts.append(Host(name, _slots(slots, f"-H {text}: the entry "
                                               f"{entry!r}", "-H node1:2")
                          if colon else None))
    if not hosts:
        raise HostListError(
            f"-H {text!r} names no host. Expected host:slots entries "
            f"separated by commas, e.g. -H node1:2,node2:2.")
    return hosts


def format_host_list(hosts):
    """The `-H` value for `hosts` ("node1:2,node2:1"; a host whose slots
    were not given counts one)."""
    return ",".join(f"{host.name}:{host.slots or 1}" for host in hosts)


def read_hostfile(path):
    """Hosts of an mpirun hostfile: one `host [slots=N] [max_slots=M]` per
    line; `#` starts a comment."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise HostListError(
            f"cannot read the hostfile {path}: {e.strerror}. Expected a file "
            f"with one `host slots=N` line per host. Check the path.") from e
    hosts = []
    for number, line in enumerate(lines, start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        name, slots = words[0], None
        if "=" in name:
            raise HostListError(
                f"{path}:{number}: the line {line.strip()!r} starts with "
                f"{name!r}, not a host name. Expected `host slots=N`.")
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key == "slots":
                slots = _slots(value, f"{path}:{number}", "`node1 slots=2`")
        hosts.append(Host(name, slots))
    if not hosts:
        raise HostListError(
            f"the hostfile {path} names no host. Expected one `host slots=N` "
            f"line per host.")
    return hosts


def distinct_names(hosts):
    """The host names in order of first appearance, each once."""
    return list(dict.fromkeys(host.name for host in hosts))
