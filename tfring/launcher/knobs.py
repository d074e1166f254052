# tfringrun's flags for the TFRING_* knobs, as one table.
#
# Why a table: every such flag does the same thing, it sets one environment
# variable for every rank (tfringrun passes it with `mpirun -x NAME=VALUE`,
# so remote hosts get it too). The flag names are horovodrun's where Horovod
# has the same knob, so a Horovod user's command line keeps working; units
# follow the flag name (`-mb` is MiB, `-ms` milliseconds). The core declares
# the knobs themselves (cc/config.h, listed by tfring._core.config()); a
# test checks that each one has a flag here. The defaults `--help` shows
# are read from there too, never written here.

import argparse
import dataclasses
import os


def _number(text, unit, example):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"got {text!r}; expected a non-negative number of {unit}, "
            f"e.g. {example}")
    return value


def _whole(text, unit, example):
    value = _number(text, unit, example)
    if not value.is_integer():
        raise argparse.ArgumentTypeError(
            f"got {text!r}; expected a whole number of {unit}, "
            f"e.g. {example}")
    return str(int(value))


def _plain(value):
    """A float as the core reads it: "2" rather than "2.0"."""
    return str(int(value)) if value.is_integer() else repr(value)


@dataclasses.dataclass(frozen=True)
class Kind:
    """How a flag's argument becomes the variable's value."""
    metavar: str
    example: str  # a sample argument, for error messages
    convert: object  # (text, example) -> the variable's value, as a string
    unit: str = ""  # the argument's unit, for error messages
    scale: int = 1  # units of the variable per unit of the argument

    def argument_type(self, flag, maximum=None, env=None):
        """argparse's `type=`: the variable's value, checked against
        `maximum` (in the variable's units) when one is given."""
        example = f"{flag} {self.example}"

        def convert(text):
            value = self.convert(text, example)
            if maximum is not None and float(value) > maximum:
                raise argparse.ArgumentTypeError(
                    f"got {text!r}; expected at most "
                    f"{_plain(maximum / self.scale)} {self.unit}, the largest "
                    f"value {env} takes, e.g. {example}")
            return value
        return convert


MIB = Kind("MB", "64", lambda text, example: str(int(round(
    _number(text, "MiB", example) * 1024 * 1024))), "MiB", 1024 * 1024)
BYTES = Kind("BYTES", "33554432",
             lambda text, example: _whole(text, "bytes", example), "bytes")
COUNT = Kind("N", "3", lambda text, example: _whole(text, "items", example),
             "items")
MILLISECONDS = Kind("MS", "2.5", lambda text, example: _plain(
    _number(text, "milliseconds", example)), "milliseconds")
SECONDS = Kind("SECONDS", "30", lambda text, example: _plain(
    _number(text, "seconds", example)), "seconds")
NUMBER = Kind("X", "0.5", lambda text, example: _plain(
    _number(text, "units", example)), "units")
# Relative paths become absolute: ranks on other hosts start in whatever
# directory their daemon gives them.
PATH = Kind("FILE", "/tmp/out", lambda text, example: os.path.abspath(text))
TEXT = Kind("SPEC", "", lambda text, example: text)

LOG_LEVELS = ("trace", "debug", "info", "warning", "error")
WIRE_COMPRESSIONS = ("none", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class KnobFlag:
    flags: tuple  # option strings; the first names the argparse dest
    env: str
    help: str
    kind: Kind = None  # None: a switch that sets `const`
    const: str = None
    choices: tuple = None
    # The largest value the variable takes (the core's bound in cc/config.h,
    # which tfring._core.config() lists as "maximum"; a test checks they
    # agree), in the variable's units; None for text.
    maximum: float = None

    @property
    def dest(self):
        return "knob_" + self.flags[0].lstrip("-").replace("-", "_")


KNOB_FLAGS = (
    KnobFlag(("--fusion-threshold-mb",), "TFRING_FUSION_THRESHOLD",
             "fusion buffer size in MiB; 0 disables fusion",
             MIB, maximum=2 ** 36),
    KnobFlag(("--cycle-time-ms",), "TFRING_CYCLE_TIME",
             "milliseconds between negotiation rounds when no work arrives",
             MILLISECONDS, maximum=60000),
    KnobFlag(("--cache-capacity",), "TFRING_CACHE_CAPACITY",
             "negotiated tensors remembered; 0 disables the response cache",
             COUNT, maximum=2 ** 16),
    KnobFlag(("--disable-cache",), "TFRING_CACHE_CAPACITY",
             "no response cache (the same as --cache-capacity 0)", const="0"),
    KnobFlag(("--direct-threshold-mb",), "TFRING_DIRECT_THRESHOLD",
             "allreduces of at least this many MiB skip the fusion buffer",
             MIB, maximum=2 ** 40),
    KnobFlag(("--no-shm",), "TFRING_SHM",
             "ranks on one host talk through MPI instead of shared memory",
             const="0"),
    KnobFlag(("--shm-bytes",), "TFRING_SHM_BYTES",
             "bytes of each rank's shared-memory slot",
             BYTES, maximum=2 ** 40),
    KnobFlag(("--shm-timeout-seconds",), "TFRING_SHM_TIMEOUT_SECONDS",
             "seconds to wait for a live peer in a shared-memory operation",
             SECONDS, maximum=10 ** 6),
    KnobFlag(("--cpu-binding",), "TFRING_CPU_BINDING",
             "bind each rank to its own share of its host's CPUs (helps "
             "when TensorFlow's thread pools are sized to that share)",
             const="1"),
    KnobFlag(("--hierarchical-allreduce",), "TFRING_HIERARCHICAL_ALLREDUCE",
             "across hosts, reduce every allreduce inside each host first, "
             "then across hosts, instead of flat over all ranks", const="1"),
    KnobFlag(("--hierarchical-allreduce-auto",),
             "TFRING_HIERARCHICAL_ALLREDUCE",
             "across hosts, only allreduces of at least "
             "--hierarchical-threshold-mb take the hierarchical path",
             const="auto"),
    KnobFlag(("--hierarchical-threshold-mb",),
             "TFRING_HIERARCHICAL_THRESHOLD",
             "with --hierarchical-allreduce-auto (and by default), the size "
             "in MiB from which allreduces may take the hierarchical path",
             MIB,
             maximum=2 ** 40),
    KnobFlag(("--hierarchical-trials",), "TFRING_HIERARCHICAL_TRIALS",
             "by default, how many large uncompressed allreduces are timed "
             "on each of the flat and hierarchical paths before the job "
             "keeps the faster", COUNT, maximum=2 ** 20),
    KnobFlag(("--wire-compression",), "TFRING_WIRE_COMPRESSION",
             "how float32 gradients cross hosts when the script asks for "
             "no compression",
             TEXT, choices=WIRE_COMPRESSIONS),
    KnobFlag(("--output-pool-bytes",), "TFRING_OUTPUT_POOL_BYTES",
             "bytes of freed collective outputs kept for reuse; 0 disables",
             BYTES, maximum=2 ** 40),
    KnobFlag(("--no-stall-check",), "TFRING_STALL_CHECK_TIME_SECONDS",
             "no warning about tensors that other ranks are late to submit",
             const="0"),
    KnobFlag(("--stall-check-warning-time-seconds",),
             "TFRING_STALL_CHECK_TIME_SECONDS",
             "seconds before rank 0 warns which ranks a tensor waits for",
             SECONDS, maximum=10 ** 6),
    KnobFlag(("--stall-check-shutdown-time-seconds",),
             "TFRING_STALL_SHUTDOWN_TIME_SECONDS",
             "seconds a tensor may wait before the job stops with an error; "
             "0 never", SECONDS, maximum=10 ** 6),
    KnobFlag(("--log-level",), "TFRING_LOG_LEVEL",
             "least severe message the core logs",
             TEXT, choices=LOG_LEVELS),
    KnobFlag(("--timeline-filename",), "TFRING_TIMELINE",
             "rank 0 records a timeline of every collective into FILE",
             PATH),
    KnobFlag(("--timeline-mark-cycles",), "TFRING_TIMELINE_MARK_CYCLES",
             "the timeline also marks each background-loop cycle",
             const="1"),
    KnobFlag(("--autotune",), "TFRING_AUTOTUNE",
             "rank 0 tunes the fusion threshold, direct threshold and cycle "
             "time while the job trains; flags given for them stay fixed",
             const="1"),
    KnobFlag(("--autotune-log-file",), "TFRING_AUTOTUNE_LOG",
             "CSV file where the autotuner records every trial", PATH),
    KnobFlag(("--autotune-start",), "TFRING_AUTOTUNE_START",
             "first trial, e.g. fusion_threshold=65536,cycle_time=1", TEXT),
    KnobFlag(("--autotune-warmup-samples",),
             "TFRING_AUTOTUNE_WARMUP_SAMPLES",
             "autotuner samples discarded at the start", COUNT,
             maximum=10 ** 6),
    KnobFlag(("--autotune-steps-per-sample", "--autotune-cycles-per-sample"),
             "TFRING_AUTOTUNE_CYCLES_PER_SAMPLE",
             "cycles that moved data per autotuner sample",
             COUNT, maximum=10 ** 6),
    KnobFlag(("--autotune-samples-per-trial",),
             "TFRING_AUTOTUNE_SAMPLES_PER_TRIAL",
             "samples per autotuner trial", COUNT,
             maximum=10 ** 4),
    KnobFlag(("--autotune-bayes-opt-max-samples", "--autotune-max-trials"),
             "TFRING_AUTOTUNE_MAX_TRIALS",
             "trials before the autotuner settles", COUNT,
             maximum=1000),
    KnobFlag(("--autotune-gaussian-process-noise",),
             "TFRING_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
             "noise the autotuner's Gaussian process assumes",
             NUMBER, maximum=100),
)


def core_defaults():
    """{TFRING_* variable: its default}, as the core declares them; empty
    where the core's library does not load (a broken installation: the
    help then shows no defaults, and a job still starts)."""
    try:
        from tfring import _core  # the core's library; loads no framework
    except ImportError:
        return {}
    return {entry["env"]: entry["default"] for entry in _core.config()}


def shown_default(knob, default):
    """The core's `default` for `knob`'s variable in the flag's own unit
    (MiB for `-mb` flags, a level's name), or None for a switch or an
    empty (or unknown) default."""
    if knob.kind is None or not default:
        return None
    if knob.choices and default.isdigit():
        return knob.choices[int(default)]
    if knob.kind is MIB:
        return _plain(int(default) / (1024 * 1024))
    return default


def _help(knob, defaults):
    default = shown_default(knob, defaults.get(knob.env))
    shown = "" if default is None else f" (default {default})"
    return f"{knob.help}{shown} [{knob.env}]"


def add_arguments(parser):
    """Adds one argument per KNOB_FLAGS entry to an argparse parser. The
    help texts get the core's defaults from show_defaults(), when help is
    shown: a job's start does not load the core's library."""
    group = parser.add_argument_group(
        "tfring settings (each sets a TFRING_* variable for every rank)")
    for knob in KNOB_FLAGS:
        help_text = _help(knob, {})
        if knob.kind is None:
            action = group.add_argument(
                *knob.flags, dest=knob.dest, action="store_const",
                const=knob.const, default=None, help=help_text)
        elif knob.choices:
            action = group.add_argument(
                *knob.flags, dest=knob.dest, default=None, type=str.lower,
                choices=knob.choices,
                metavar="{" + ",".join(knob.choices) + "}", help=help_text)
        else:
            action = group.add_argument(
                *knob.flags, dest=knob.dest, default=None,
                type=knob.kind.argument_type(knob.flags[0], knob.maximum,
                                             knob.env),
                metavar=knob.kind.metavar, help=help_text)
        action.tfring_knob = knob


def show_defaults(parser):
    """Ends the help text of every knob flag of `parser` with the core's
    default for its variable, in the flag's unit."""
    defaults = core_defaults()
    for action in parser._actions:
        knob = getattr(action, "tfring_knob", None)
        if knob is not None:
            action.help = _help(knob, defaults)


def settings(args):
    """The TFRING_* variables the parsed flags set: {name: value}.

    Raises ValueError when two flags set the same variable."""
    chosen, given_by = {}, {}
    for knob in KNOB_FLAGS:
        value = getattr(args, knob.dest, None)
        if value is None:
            continue
        if knob.env in chosen:
            raise ValueError(
                f"{given_by[knob.env]} and {knob.flags[0]} both set "
                f"{knob.env}. Expected at most one of them. Keep the one "
                f"you mean.")
        chosen[knob.env] = value
        given_by[knob.env] = knob.flags[0]
    return chosen
