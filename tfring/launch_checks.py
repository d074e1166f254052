# `tfringrun --check-build` and `tfringrun --check-hosts`: find what would
# stop a job before the job starts.
#
# Why: a tfring job needs several things to agree: the op library and the
# installed TensorFlow, mpirun and the MPI library mpi4py loads, and on
# several hosts the same Python, TensorFlow and tfring everywhere. When one
# of them does not, the job fails late, on many ranks at once, far from the
# cause (an undefined symbol, ranks that each believe they are alone, a hang
# in ssh). These checks look at each part, run a real job where only a job
# can tell, and say for the first thing that is wrong what was found, what
# was expected and how to fix it.

import copy
import dataclasses
import ipaddress
import os
import re
import socket
import subprocess
import sys

from tfring import launch_command
from tfring import launch_hosts
from tfring import launch_probes
from tfring.launch_job import run_job

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
                              text=True, timeout=timeout)
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
    ("Open MPI", r"\(Open MPI\) (\d[\w.]*)"),   # mpirun (Open MPI) 5.0.11
    ("Open MPI", r"Open MPI v(\d[\w.]*)"),        # Open MPI v5.0.11, package...
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
    """A problem message when mpirun and the MPI library mpi4py loads come
    from different MPI installations; None when they agree or either
    cannot be identified."""
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
    """tfring, Python and TensorFlow as this process finds them."""
    from tfring import _version
    here = os.path.dirname(os.path.abspath(__file__))
    findings = [Finding("tfring", f"{_version.__version__} ({here})"),
                Finding("Python", f"{sys.version.split()[0]} "
                                  f"({sys.executable})")]
    from tfring import _version_check
    try:
        tf = _version_check.check_tensorflow_version()
        from tfring.ops import loader
        loader.load_ops_library()
    except ImportError as e:
        findings.append(Finding("TensorFlow", "op library does not load",
                                problem=str(e)))
        return findings
    from tfring import _build_info
    findings.append(Finding(
        "TensorFlow", f"{tf.__version__}; the op library was built for "
                      f"{_build_info.TF_VERSION} and loads"))
    return findings


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


def _job_findings(result, timeout, launcher_text, mpirun):
    """Findings from the 2-rank allreduce job's reports."""
    fixes = ("Run the same command with --verbose to see the mpirun line, "
             "and run that line by hand with a small mpi4py script.")
    reports = result.reports()
    failed = [r for r in reports if r.get("error")]
    if failed:
        r = failed[0]
        return [Finding("2-rank allreduce", "rank failed", problem=(
            f"a rank of the 2-rank check job on {r.get('hostname')} failed: "
            f"{r['error']}. Expected tfring.init() and an allreduce to "
            f"succeed. Fix what the error names.\n{r.get('traceback', '')}"
            f"{result.tail()}"))]
    if result.returncode != 0 or len(reports) != 2:
        return [Finding("2-rank allreduce", "did not finish", problem=(
            f"the 2-rank check job {result.ending(timeout)} after "
            f"{result.seconds:.1f} s with {len(reports)} of 2 reports. "
            f"Expected both ranks to start tfring, allreduce and exit within "
            f"{timeout:g} s (--start-timeout). {fixes}\n{result.tail()}"))]
    by_rank = sorted(reports, key=lambda r: r["rank"])
    sizes = sorted({r["size"] for r in reports})
    if sizes != [2]:
        mismatch = launcher_library_mismatch(
            launcher_text, reports[0]["mpi_library"], mpirun) or ""
        return [Finding("2-rank allreduce", "ranks did not see each other",
                        problem=(
            f"mpirun started 2 processes, but tfring.size() was "
            f"{' and '.join(str(r['size']) for r in reports)}: each process "
            f"ran as an MPI job of its own. Expected one job of size 2. "
            f"This happens when mpirun belongs to another MPI installation "
            f"than the library mpi4py loads ({launcher_text.splitlines()[0]!r} "
            f"against {reports[0]['mpi_library'].splitlines()[0]!r}). "
            f"{mismatch}"))]
    rank0 = by_rank[0]
    findings = []
    library = rank0["mpi_library"].splitlines()[0]
    findings.append(Finding(
        "MPI library", f"{library.split(',')[0]} (mpi4py {rank0['mpi4py']}); "
                       f"thread level {rank0['thread_level']}",
        problem=launcher_library_mismatch(launcher_text, library, mpirun)))
    nccl = rank0["nccl"]
    findings.append(Finding("NCCL", f"yes (version {nccl})" if nccl
                            else "no (tfring was built without NCCL)"))
    findings.append(Finding(
        "shared memory", "yes (2 ranks on one host)" if rank0["shm"]
        else f"no: {_shm_reason(rank0, result)}; the ranks use MPI"))
    floats, ints = launch_probes.expected_sums(2)
    wrong = [r for r in by_rank
             if r["float_sum"] != floats or r["int_sum"] != ints]
    if wrong:
        r = wrong[0]
        findings.append(Finding("2-rank allreduce", "wrong result", problem=(
            f"rank {r['rank']} got float32 {r['float_sum']} and int32 "
            f"{r['int_sum']} from Sum allreduces. Expected {floats} and "
            f"{ints}. This is a bug in tfring or the MPI library; report it "
            f"with the output of --check-build --verbose.")))
    else:
        findings.append(Finding(
            "2-rank allreduce", f"ok: Sum gave float32 {floats} and int32 "
                                f"{ints} on both ranks ({result.seconds:.1f} s)"))
    return findings


def check_build(args, mpirun, environ, euid, cpu_count, out=sys.stdout):
    """Prints what was built and what works here; returns the exit status."""
    findings = _local_build_findings()
    try:
        launcher_text = _launcher_version(mpirun, args.start_timeout)
        findings.append(Finding(
            "MPI launcher", f"{mpirun}: {launcher_text.splitlines()[0]}"))
    except RuntimeError as e:
        launcher_text = None
        findings.append(Finding("MPI launcher", mpirun, problem=(
            f"{e}. Expected Open MPI's mpirun to print its version. Point "
            f"TFRING_MPIRUN at a working mpirun.")))
    if not any(f.problem for f in findings):
        job = copy.copy(args)
        job.num_proc, job.hosts, job.hostfile = 2, None, None
        job.host_entries, job.output_filename = [], None
        job.command = [sys.executable, "-m", "tfring.launch_probes",
                       "allreduce"]
        command = launch_command.mpirun_command(job, mpirun, environ, euid,
                                                cpu_count)
        if args.verbose:
            print(f"  running: {' '.join(command)}", file=out, flush=True)
        result = run_job(command, args.start_timeout)
        findings += _job_findings(result, args.start_timeout, launcher_text,
                                  mpirun)
    print("tfringrun --check-build", file=out)
    for finding in findings:
        print(finding.line(), file=out)
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
    (this machine's host_report()), or None when every host matches.

    host_reports: [(host name as given, its report)] in the user's order.
    interfaces: --network-interface values, which every host must have.
    """
    for interface in interfaces:
        if (_is_interface_name(interface)
                and interface not in local["interfaces"]):
            return _missing_interface("this machine (which runs mpirun)",
                                      interface, local)
    for name, report in host_reports:
        where = f"{report['executable']} on {name}"
        if report.get("error"):
            return (f"host {name}: importing tfring failed ({where}): "
                    f"{report['error']}. Expected TensorFlow "
                    f"{local['tensorflow']} and tfring {local['tfring']} to "
                    f"import there as they do here. Install the same "
                    f"environment on {name} at {local['executable']}.")
        for key, label in _COMPARED_VERSIONS:
            if report.get(key) != local.get(key):
                return (f"host {name} has {label} {report.get(key)} "
                        f"({where}), this machine has {label} "
                        f"{local.get(key)} ({local['executable']}). Expected "
                        f"the same {label} on every host (ranks built "
                        f"differently can disagree on what they send). "
                        f"Install {label} {local.get(key)} on {name}, or run "
                        f"tfringrun from an environment that matches "
                        f"{name}'s.")
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


def _hosts_job(args, mpirun, environ, euid, cpu_count, names, command):
    """The mpirun command that runs `command` once on each host.

    Without the job's --network-interface: an interface missing somewhere
    would stop mpirun before any host could report; the reports show which
    host lacks it."""
    job = copy.copy(args)
    job.num_proc, job.hostfile, job.output_filename = len(names), None, None
    job.network_interfaces = None
    job.hosts = ",".join(f"{name}:1" for name in names)
    job.host_entries = [launch_hosts.Host(name, 1) for name in names]
    job.command = command
    return launch_command.mpirun_command(job, mpirun, environ, euid,
                                         cpu_count)


def _first_unreachable(args, facts, names):
    """The first of `names` where mpirun cannot start Python, with the
    problem message; (None, None) when it starts on each of them alone."""
    for name in names:
        command = _hosts_job(args, *facts, [name],
                             [sys.executable, "-c", "pass"])
        result = run_job(command, args.start_timeout)
        if result.returncode != 0:
            return name, _unreachable(name, result, args.start_timeout)
    return None, None


def _compare_with_this_machine(reports, args, out):
    local = launch_probes.host_report()
    if local["error"]:
        return (f"this machine cannot import tfring: {local['error']}. "
                f"Expected it to, to compare the hosts with it. Run "
                f"tfringrun --check-build here.")
    print(f"  {'(this machine)':<20} Python {local['python']}, TensorFlow "
          f"{local['tensorflow']}, tfring {local['tfring']} "
          f"({local['hostname']}, {local['executable']})", file=out)
    for name, report in reports:
        print(f"  {name:<20} Python {report['python']}, TensorFlow "
              f"{report['tensorflow']}, tfring {report['tfring']} "
              f"({report['hostname']}, {report['executable']})", file=out)
    return first_host_mismatch(local, reports, args.network_interfaces or ())


def check_hosts(args, mpirun, environ, euid, cpu_count, out=sys.stdout):
    """Starts one reporter per host through mpirun and compares each host's
    versions with this machine's; returns the exit status."""
    facts = (mpirun, environ, euid, cpu_count)
    names = launch_hosts.distinct_names(args.host_entries)
    command = _hosts_job(args, *facts, names, [
        sys.executable, "-m", "tfring.launch_probes", "host-report"])
    print(f"tfringrun --check-hosts: {', '.join(names)}", file=out,
          flush=True)
    if args.verbose:
        print(f"  running: {' '.join(command)}", file=out, flush=True)
    result = run_job(command, args.start_timeout)
    by_rank = {r["launch_rank"]: r for r in result.reports()}
    missing = [name for rank, name in enumerate(names) if rank not in by_rank]
    if missing:
        # mpirun stops the whole job when one host fails, so the hosts
        # without a report are not necessarily the culprits: try each alone.
        _, problem = _first_unreachable(args, facts, names)
        if problem is None:
            problem = (f"host {missing[0]} did not report back: mpirun "
                       f"{result.ending(args.start_timeout)} after "
                       f"{result.seconds:.1f} s, although it starts Python "
                       f"on each host alone. Expected one report per host. "
                       f"Run again with --verbose and look at mpirun's "
                       f"output.\n{result.tail()}")
    else:
        problem = _compare_with_this_machine(
            [(name, by_rank[rank]) for rank, name in enumerate(names)],
            args, out)
    if problem:
        print(f"\ntfringrun: check failed: {problem}", file=out, flush=True)
        return 1
    print(f"\nall {len(names)} host(s) reachable, with the versions this "
          f"machine has", file=out, flush=True)
    return 0
