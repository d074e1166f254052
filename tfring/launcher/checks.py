# `tfringrun --check-build` and `tfringrun --check-hosts`: find what would
# stop a job before the job starts.
#
# Why: a tfring job needs several things to agree: the op library and the
# installed TensorFlow, mpirun and the MPI library mpi4py loads, and on
# several hosts the same Python, TensorFlow and tfring everywhere. When one
# of them does not, the job fails late, on many ranks at once, far from the
# cause (an undefined symbol, ranks that each believe they are alone, a hang
# in ssh). These checks look at each part, run a real job where only a job
# can tell (what runs on the ranks is tfring/launcher/probes.py), and say for
# the first thing that is wrong what was found, what was expected and how to
# fix it.
#
# Every job a check starts is bounded in time and leaves nothing behind: a
# broken setup (an unreachable host, ranks that never meet) would otherwise
# hang the check it is meant to explain.

import concurrent.futures
import copy
import dataclasses
import importlib.util
import ipaddress
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

from tfring.launcher import command as launch_command
from tfring.launcher import hosts as launch_hosts
from tfring.launcher import probes as launch_probes

# How much of a failed job's output a report quotes.
_OUTPUT_TAIL_LINES = 30

# How many hosts --check-hosts tries at once when it looks for the one that
# stopped the job.
_HOSTS_TRIED_AT_ONCE = 16


# ----------------------------------------------------------------------------
# A check's job: bounded in time, output captured, nothing left behind.

@dataclasses.dataclass
class JobResult:
    command: list
    returncode: int  # None when the job ran past its time limit
    output: str  # stdout and stderr, interleaved
    seconds: float

    @property
    def timed_out(self):
        return self.returncode is None

    def reports(self):
        """The probe reports the job printed, in the order printed."""
        found = []
        for line in self.output.splitlines():
            _, mark, payload = line.partition(launch_probes.REPORT_MARK)
            if mark:
                try:
                    found.append(json.loads(payload))
                except ValueError:
                    pass  # A line cut by other output: a missing report.
        return found

    def ending(self, limit):
        return (f"ran past the {limit:g} s limit" if self.timed_out
                else f"exited with status {self.returncode}")

    def tail(self):
        lines = [line for line in self.output.splitlines()
                 if launch_probes.REPORT_MARK not in line]
        shown = "\n".join("    " + line
                          for line in lines[-_OUTPUT_TAIL_LINES:])
        return (f"  last {min(len(lines), _OUTPUT_TAIL_LINES)} lines of "
                f"mpirun's output:\n{shown}" if lines else
                "  mpirun printed nothing.")


def _descendants(pid):
    """Every process below `pid` (children, their children, ...)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, waiting = [], [pid]
    while waiting:
        for child in children.get(waiting.pop(), []):
            found.append(child)
            waiting.append(child)
    return found


def run_job(command, timeout, env=None):
    """Runs an mpirun command, capturing its output, for at most `timeout`
    seconds. Past that it stops mpirun (which stops its ranks) and then
    kills whatever of the job is left: mpirun starts each rank in a process
    group of its own, so ending mpirun's group alone could leave ranks
    behind."""
    start = time.monotonic()
    # A session of its own: no terminal, so ssh fails instead of asking for
    # a password nobody sees.
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace",
                            start_new_session=True, env=env)
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        job = _descendants(proc.pid)
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for pid in job + ([proc.pid] if proc.poll() is None else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # Already gone.
        output, _ = proc.communicate()
        returncode = None
    return JobResult(command, returncode, output,
                     time.monotonic() - start)


def _job_args(args, **changes):
    """A copy of tfringrun's parsed arguments for a check's own job: the
    user's TFRING_* flags stay, output goes to the check."""
    job = copy.copy(args)
    job.output_filename = None
    for name, value in changes.items():
        setattr(job, name, value)
    return job


# ----------------------------------------------------------------------------
# --check-build

@dataclasses.dataclass
class Finding:
    label: str
    text: str
    problem: str = None  # None: this part works

    def line(self):
        status = "FAILED: " if self.problem else ""
        return f"  {self.label:<17} {status}{self.text}"


def _launcher_version(mpirun, timeout):
    """What `mpirun --version` prints, or raises RuntimeError."""
    try:
        done = subprocess.run([mpirun, "--version"], capture_output=True,
                              text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"`{mpirun} --version` failed: {e}") from e
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or not text:
        raise RuntimeError(f"`{mpirun} --version` exited with status "
                           f"{done.returncode}: {text[:300]!r}")
    return text


# (vendor, pattern whose group 1 is the version) for `mpirun --version` and
# MPI_Get_library_version() texts.
_MPI_VERSION_PATTERNS = (
    ("Open MPI", r"\(Open MPI\) (\d[\w.]*)"),  # mpirun (Open MPI) 5.0.11
    ("Open MPI", r"Open MPI v(\d[\w.]*)"),       # Open MPI v5.0.11, ...
    ("MPICH", r"MPICH Version:\s*(\d[\w.]*)"),
    ("MPICH", r"HYDRA build details:\s*Version:\s*(\d[\w.]*)"),
)


def mpi_implementation(text):
    """(vendor, version) named by `mpirun --version` or
    MPI_Get_library_version() text; None when it is neither Open MPI nor
    MPICH."""
    for vendor, pattern in _MPI_VERSION_PATTERNS:
        match = re.search(pattern, text)
        if match:
            return vendor, match.group(1)
    return None


def launcher_library_mismatch(launcher_text, library_text, mpirun):
    """A message when mpirun and the MPI library mpi4py loads come from
    different MPI installations; None when they agree or either cannot be
    identified."""
    launcher = mpi_implementation(launcher_text)
    library = mpi_implementation(library_text)
    if launcher is None or library is None or launcher == library:
        return None
    return (f"{mpirun} is {launcher[0]} {launcher[1]}, but mpi4py loads "
            f"{library[0]} {library[1]}. Expected mpirun from the same MPI "
            f"installation as the library, or the ranks cannot find each "
            f"other. Point TFRING_MPIRUN at that installation's mpirun, or "
            f"reinstall mpi4py against this mpirun's MPI.")


def _local_build_findings():
    """tfring, Python, TensorFlow and PyTorch as this process finds them,
    and which frameworks the 2-rank jobs can check: ([Finding],
    tensorflow_loads, torch_installed).

    TensorFlow is imported here, with tfring's op library (whose import
    checks that it was built for this TensorFlow and stops with an
    ImportError naming both versions when it was not). PyTorch is only
    looked up: a process that has loaded TensorFlow must not import torch
    (it crashes some torch releases), so its own job imports it."""
    from tfring import _version
    here = os.path.dirname(os.path.abspath(__file__))
    findings = [
        Finding("tfring", f"{_version.__version__} ({here})"),
        Finding("Python", f"{sys.version.split()[0]} ({sys.executable})"),
    ]
    tensorflow_loads = False
    if importlib.util.find_spec("tensorflow") is None:
        findings.append(Finding("TensorFlow", "not installed (tfring's "
                                "TensorFlow API needs it, tfring.torch "
                                "does not)"))
    else:
        try:
            import tensorflow as tf
            import tfring.ops  # noqa: F401 (loads the op library)
            from tfring import _build_info
            findings.append(Finding(
                "TensorFlow", f"{tf.__version__}; the op library was built "
                              f"for {_build_info.TF_VERSION} and loads"))
            tensorflow_loads = True
        except ImportError as e:
            findings.append(Finding("TensorFlow", "does not load tfring's "
                                    "op library", problem=str(e)))
    torch_installed = importlib.util.find_spec("torch") is not None
    if not torch_installed:
        findings.append(Finding("PyTorch", "not installed (tfring.torch "
                                "needs it, TensorFlow jobs do not)"))
        if importlib.util.find_spec("tensorflow") is None:
            findings[-1].problem = (
                "neither TensorFlow nor PyTorch is installed in this Python "
                f"environment ({sys.executable}). Expected one of them: "
                f"tfring's API runs on TensorFlow, tfring.torch on PyTorch. "
                f"Install one (`pip install tensorflow` or `pip install "
                f"torch`).")
    return findings, tensorflow_loads, torch_installed


def _shm_reason(report, result):
    """Why rank 0 found the shared-memory path off."""
    if report.get("config", {}).get("TFRING_SHM") == "0":
        return "TFRING_SHM=0 (or --no-shm) turns it off"
    if report.get("local_size") != report.get("size"):
        return "the ranks are on different hosts"
    for line in result.output.splitlines():
        if "shared memory is not used" in line:
            return line.strip()
    return "rank 0 gave no reason; run with --log-level debug"


def job_findings(result, timeout, launcher_text, mpirun):
    """Findings from the 2-rank allreduce job's result and reports."""
    reports = result.reports()
    failed = [r for r in reports if r.get("error")]
    if failed:
        r = failed[0]
        return [Finding("2-rank allreduce", "a rank failed", problem=(
            f"rank {r.get('launch_rank')} of the 2-rank check job on "
            f"{r.get('hostname')} failed: {r['error']}. Expected "
            f"tfring.init() and two allreduces to succeed. Fix what the "
            f"error names.\n{r.get('traceback', '')}{result.tail()}"))]
    if result.returncode != 0 or len(reports) != 2:
        return [Finding("2-rank allreduce", "did not finish", problem=(
            f"the 2-rank check job {result.ending(timeout)} after "
            f"{result.seconds:.1f} s with {len(reports)} of 2 reports. "
            f"Expected both ranks to start tfring, allreduce and exit within "
            f"{timeout:g} s. If the machine is only slow, raise "
            f"--start-timeout; otherwise run with --verbose to see the "
            f"mpirun line and run it by hand.\n{result.tail()}"))]
    by_rank = sorted(reports, key=lambda r: r["rank"])
    rank0 = by_rank[0]
    library = rank0["mpi_library"].splitlines()[0]
    mismatch = launcher_library_mismatch(launcher_text, library, mpirun)
    if sorted(r["size"] for r in reports) != [2, 2]:
        return [Finding("2-rank allreduce", "the ranks did not meet",
                        problem=(
            f"mpirun started 2 processes, but tfring.size() was "
            f"{' and '.join(str(r['size']) for r in reports)}: each process "
            f"ran as an MPI job of its own. Expected one job of size 2. "
            f"This happens when mpirun comes from another MPI installation "
            f"than the library mpi4py loads "
            f"({launcher_text.splitlines()[0]!r} against {library!r}). "
            f"{mismatch or 'Use the mpirun of the MPI that mpi4py loads.'}"))]
    findings = [Finding(
        "MPI library", f"{library.split(',')[0]} (mpi4py {rank0['mpi4py']}); "
                       f"thread level {rank0['thread_level']}"
                       + (f"; note: {mismatch}" if mismatch else ""))]
    nccl = rank0["nccl"]
    findings.append(Finding("NCCL", f"yes (version {nccl})" if nccl
                            else "no (tfring was built without NCCL)"))
    findings.append(Finding(
        "shared memory", "yes (2 ranks on one host)" if rank0["shm"]
        else f"no: {_shm_reason(rank0, result)}; the ranks use MPI"))
    findings.append(_allreduce_finding(
        "2-rank allreduce", by_rank, result, "Sum allreduces",
        "tfring or the MPI library"))
    return findings


def _allreduce_finding(label, by_rank, result, what, culprit):
    """The finding of a check job's two Sum allreduces (float32, int32):
    ok with the sums, or the first rank whose sums are wrong."""
    floats, ints = launch_probes.expected_sums(2)
    wrong = [r for r in by_rank
             if r["float_sum"] != floats or r["int_sum"] != ints]
    if wrong:
        r = wrong[0]
        return Finding(label, "wrong result", problem=(
            f"rank {r['rank']} got float32 {r['float_sum']} and int32 "
            f"{r['int_sum']} from {what}. Expected {floats} and {ints}. "
            f"This is a bug in {culprit}; report it with the output of "
            f"--check-build --verbose."))
    return Finding(label, f"ok: Sum gave float32 {floats} and int32 {ints} "
                          f"on both ranks ({result.seconds:.1f} s)")


def torch_job_findings(result, timeout):
    """Findings from the 2-rank tfring.torch job's result and reports."""
    reports = result.reports()
    failed = [r for r in reports if r.get("error")]
    if failed:
        r = failed[0]
        return [Finding("PyTorch", r.get("torch") or "does not import",
                        problem=(
            f"rank {r.get('launch_rank')} of the 2-rank tfring.torch check "
            f"job on {r.get('hostname')} failed: {r['error']}. Expected "
            f"tfring.torch to import with torch {r.get('torch')} and "
            f"tfring.torch.init() and two allreduces to succeed. Fix what "
            f"the error names.\n{r.get('traceback', '')}{result.tail()}"))]
    if result.returncode != 0 or len(reports) != 2:
        return [Finding("torch allreduce", "did not finish", problem=(
            f"the 2-rank tfring.torch check job {result.ending(timeout)} "
            f"after {result.seconds:.1f} s with {len(reports)} of 2 reports. "
            f"Expected both ranks to import torch, start tfring.torch, "
            f"allreduce and exit within {timeout:g} s. If the machine is "
            f"only slow, raise --start-timeout; otherwise run with "
            f"--verbose to see the mpirun line and run it by hand."
            f"\n{result.tail()}"))]
    by_rank = sorted(reports, key=lambda r: r["rank"])
    findings = [Finding("PyTorch", f"{by_rank[0]['torch']}; tfring.torch "
                                   f"imports")]
    findings.append(_allreduce_finding(
        "torch allreduce", by_rank, result, "tfring.torch Sum allreduces",
        "tfring"))
    return findings


def _run_probe(args, probe, mpirun, environ, euid, cpu_count, out):
    """Runs `python -m tfring.launcher.probes PROBE` on 2 ranks here, as
    tfringrun starts a job (mpirun's listeners on loopback)."""
    job = _job_args(args, num_proc=2, hosts=None, hostfile=None,
                    host_entries=[], command=[
                        sys.executable, "-m", "tfring.launcher.probes",
                        probe])
    command = launch_command.mpirun_command(
        job, mpirun, environ, euid, cpu_count)
    if args.verbose:
        print(f"  running: {shlex.join(command)}", file=out, flush=True)
    env = launch_command.launcher_environment(
        job, environ, launch_command.installed_loopback_library())
    return run_job(command, args.start_timeout, env=env)


def check_build(args, mpirun, environ, euid, cpu_count, out=sys.stdout):
    """Prints what was built and what works here; returns the exit status.

    The findings are printed as they come (the 2-rank job takes a while);
    the problems are explained at the end."""
    print("tfringrun --check-build", file=out, flush=True)
    findings = []

    def found(*new):
        for finding in new:
            print(finding.line(), file=out, flush=True)
        findings.extend(new)

    local, tensorflow_loads, torch_installed = _local_build_findings()
    found(*local)
    try:
        launcher_text = _launcher_version(mpirun, args.start_timeout)
        found(Finding("MPI launcher",
                      f"{mpirun}: {launcher_text.splitlines()[0]}"))
    except RuntimeError as e:
        launcher_text = None
        found(Finding("MPI launcher", mpirun, problem=(
            f"{e}. Expected Open MPI's mpirun to print its version. Point "
            f"TFRING_MPIRUN at a working mpirun.")))
    facts = (mpirun, environ, euid, cpu_count, out)
    # A job that ran past its limit says mpirun cannot start one here; a
    # second job would only wait as long again.
    launcher_works = launcher_text is not None
    if launcher_works and tensorflow_loads:
        result = _run_probe(args, "allreduce", *facts)
        found(*job_findings(result, args.start_timeout, launcher_text,
                            mpirun))
        launcher_works = not result.timed_out
    if launcher_works and torch_installed:
        result = _run_probe(args, "torch-allreduce", *facts)
        found(*torch_job_findings(result, args.start_timeout))
    problems = [f for f in findings if f.problem]
    for finding in problems:
        print(f"\ntfringrun: check failed: {finding.label}: "
              f"{finding.problem}", file=out)
    print("\nall checks passed" if not problems else
          f"\n{len(problems)} check(s) failed", file=out, flush=True)
    return 1 if problems else 0


# ----------------------------------------------------------------------------
# --check-hosts

_COMPARED_VERSIONS = (("python", "Python"), ("tensorflow", "TensorFlow"),
                      ("tfring", "tfring"))


def _is_interface_name(spec):
    """Whether a --network-interface value names an interface; Open MPI and
    PRRTE also take subnets (192.168.0.0/16) and addresses."""
    if "/" in spec:
        return False
    try:
        ipaddress.ip_address(spec)
    except ValueError:
        return True
    return False


def _missing_interface(where, interface, report):
    return (f"{where} has no network interface {interface!r} (it has "
            f"{', '.join(report['interfaces'])}). Expected "
            f"--network-interface to name interfaces that every host and "
            f"this machine have. Name one they all have, or a subnet such as "
            f"192.168.0.0/16.")


def first_host_mismatch(local, host_reports, interfaces=()):
    """The problem with the first host whose report differs from `local`
    (this machine's host report), or None when every host matches.

    host_reports: [(host name as given, its report)] in the user's order; a
    report may lack versions it could not read, and then carries `error`.
    interfaces: --network-interface values, which every host must have.
    """
    for interface in interfaces:
        if (_is_interface_name(interface)
                and interface not in local["interfaces"]):
            return _missing_interface("this machine (which runs mpirun)",
                                      interface, local)
    for name, report in host_reports:
        where = f"{report.get('executable')} on {name}"
        for key, label in _COMPARED_VERSIONS:
            theirs, ours = report.get(key), local[key]
            if theirs is not None and theirs != ours:
                return (f"host {name} has {label} {theirs} ({where}), this "
                        f"machine has {label} {ours} "
                        f"({local['executable']}). Expected the same "
                        f"{label} on every host (ranks built differently can "
                        f"disagree on what they send). Install {label} "
                        f"{ours} on {name}, or run tfringrun from an "
                        f"environment that matches {name}'s.")
        if report.get("error"):
            return (f"host {name}: importing tfring failed ({where}): "
                    f"{report['error']}. Expected TensorFlow "
                    f"{local['tensorflow']} and tfring {local['tfring']} to "
                    f"import there as they do here. Install the same "
                    f"environment on {name} at {local['executable']}.")
        for interface in interfaces:
            if (_is_interface_name(interface)
                    and interface not in report["interfaces"]):
                return _missing_interface(f"host {name}", interface, report)
    return None


def _resolution(name):
    """How `name` resolves here, for an unreachable host's message."""
    try:
        address = socket.getaddrinfo(name, None)[0][4][0]
    except (socket.gaierror, UnicodeError) as e:
        return (f"its name does not resolve on this machine ({e}); add it to "
                f"/etc/hosts or DNS, or give its address instead")
    return f"its name resolves to {address} here"


def _unreachable(name, result, timeout):
    return (f"host {name} is not reachable through mpirun: starting Python "
            f"there {result.ending(timeout)} after {result.seconds:.1f} s, "
            f"and {_resolution(name)}. Expected mpirun to start a process on "
            f"every host. Check that the name resolves (/etc/hosts, DNS), "
            f"that `ssh {name} true` works from here without a password "
            f"prompt, and that {sys.executable} exists on {name} (every host "
            f"runs the same environment path).\n{result.tail()}")


def _one_per_host_command(args, facts, names, program):
    """The mpirun line that runs `program + [name]` once on each host.

    One application context per host (`-np 1 -H a:1 ... : -np 1 -H b:1
    ...`), so each process is told the name it was started for: mpirun
    merges names that mean one machine (localhost and its hostname), so a
    rank number would not tell. Without the job's --network-interface: an
    interface missing somewhere would stop mpirun before any host could
    report, while the reports show which host lacks it."""
    job = _job_args(args, num_proc=1, hosts=f"{names[0]}:1", hostfile=None,
                    host_entries=[launch_hosts.Host(n, 1) for n in names],
                    network_interfaces=None, command=program + [names[0]])
    command = launch_command.mpirun_command(job, *facts)
    for name in names[1:]:
        command += [":", "-np", "1", "-H", f"{name}:1"] + program + [name]
    return command


def _first_unreachable(args, facts, names):
    """The problem with the first of `names` (in order) where mpirun cannot
    start Python on that host alone, or None. The hosts are tried at once,
    so a host that hangs costs one time limit, not one per host."""
    def try_alone(name):
        return run_job(_one_per_host_command(
            args, facts, [name], [sys.executable, "-c", "pass"]),
            args.start_timeout)

    workers = min(len(names), _HOSTS_TRIED_AT_ONCE)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(try_alone, names))
    for name, result in zip(names, results):
        if result.returncode != 0:
            return _unreachable(name, result, args.start_timeout)
    return None


def _versions_line(label, report):
    return (f"  {label:<20} Python {report.get('python')}, TensorFlow "
            f"{report.get('tensorflow')}, tfring {report.get('tfring')} "
            f"({report.get('hostname', '?')}, {report.get('executable')})")


def check_hosts(args, mpirun, environ, euid, cpu_count, out=sys.stdout):
    """Starts one reporter per host through mpirun and compares each host's
    versions with this machine's; returns the exit status."""
    facts = (mpirun, environ, euid, cpu_count)
    names = launch_hosts.distinct_names(args.host_entries)
    command = _one_per_host_command(
        args, facts, names,
        [sys.executable, "-c", launch_probes.HOST_REPORT_CODE])
    print(f"tfringrun --check-hosts: {', '.join(names)}", file=out,
          flush=True)
    if args.verbose:
        print(f"  running: {shlex.join(command)}", file=out, flush=True)
    result = run_job(command, args.start_timeout)
    by_name = {r.get("given_name"): r for r in result.reports()}
    missing = [name for name in names if name not in by_name]
    if missing:
        # mpirun stops the whole job when one host fails, so the hosts
        # without a report are not necessarily the culprits: try each alone.
        problem = _first_unreachable(args, facts, names) or (
            f"host {missing[0]} did not report back: mpirun "
            f"{result.ending(args.start_timeout)} after "
            f"{result.seconds:.1f} s, although it starts Python on each host "
            f"alone. Expected one report per host. Run again with --verbose "
            f"and look at mpirun's output.\n{result.tail()}")
    else:
        local = launch_probes.host_report("this machine")
        print(_versions_line("(this machine)", local), file=out)
        for name in names:
            print(_versions_line(name, by_name[name]), file=out)
        problem = first_host_mismatch(
            local, [(name, by_name[name]) for name in names],
            args.network_interfaces or ())
    if problem:
        print(f"\ntfringrun: check failed: {problem}", file=out, flush=True)
        return 1
    print(f"\nall {len(names)} host(s) reachable, with the versions this "
          f"machine has", file=out, flush=True)
    return 0
