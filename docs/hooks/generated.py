"""MkDocs hook: the tables that are generated from the code at build time.

Why: the environment variables and tfringrun's flags each have one source of
truth in the code (the core's knob table in cc/config.h, listed by
`tfring._core.config()`; tfringrun's argparse parser, whose knob flags come
from the launcher's knob table). A page asks for one of these tables with a
marker line, and the build writes the table in its place, so the site cannot
drift from the code. An unknown marker fails the build.

    <!-- generated: environment-variables -->
    <!-- generated: horovod-variables -->
    <!-- generated: tfringrun-flags -->
    <!-- generated: compare-table -->    (benchmarks/compare.py --markdown
                                           docs/compare.json)
"""
import argparse
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def _import_tfring():
    # The build may run from anywhere; the pages describe this source tree.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def _cell(text):
    """Text safe inside a Markdown table cell, with TFRING_* names as code."""
    text = str(text).replace("|", "\\|").replace("\n", " ")
    return re.sub(r"(?<![`\w])(TFRING_[A-Z_]+)", r"`\1`", text)


def _knob_flags():
    """{TFRING_* variable: ['`--flag ARG`', ...]} from the launcher's table."""
    from tfring.launcher import knobs
    flags = {}
    for knob in knobs.KNOB_FLAGS:
        if knob.kind is None:
            shown = f"`{knob.flags[0]}` (= {knob.const})"
        else:
            metavar = ("{" + ",".join(knob.choices) + "}" if knob.choices
                       else knob.kind.metavar)
            shown = " or ".join(f"`{flag} {metavar}`" for flag in knob.flags)
        flags.setdefault(knob.env, []).append(shown)
    return flags


def environment_variables():
    """One row per knob of the core, in the order cc/config.h declares them."""
    _import_tfring()
    from tfring import _core
    flags = _knob_flags()
    rows = ["| variable | default | at most | scope | tfringrun flag | "
            "Horovod's name | meaning |",
            "|---|---|---|---|---|---|---|"]
    for knob in _core.config():
        default = knob["default"] if knob["default"] != "" else '""'
        rows.append("| `{}` | {} | {} | {} | {} | {} | {} |".format(
            knob["env"], _cell(default), _cell(knob["maximum"]),
            knob["scope"], ", ".join(flags.get(knob["env"], [])) or "",
            ", ".join(f"`{name}`" for name in knob["horovod"]),
            _cell(knob["doc"])))
    return "\n".join(rows)


# How tfring treats each kind of HOROVOD_* variable (cc/config.h's
# HorovodMeaning, as tfring._core.horovod_variables() names it).
_HOROVOD_TREATMENT = {
    "same": "read as {knob}",
    "switch": "read as {knob}",
    "disables": "read as {knob}",
    "timeline": "read as {knob}",
    "log_level": "read as {knob}",
    "python": "read by `tfring.init()`",
    "already_so": "nothing to do: tfring always behaves so",
    "ignored": "ignored, with a warning",
    "build_time": "ignored, with a warning (build-time setting)",
}


def horovod_variables():
    """One row per HOROVOD_* variable (or family) tfring knows."""
    _import_tfring()
    from tfring import _core
    rows = ["| Horovod's variable | in tfring | values, or why not |",
            "|---|---|---|"]
    for variable in _core.horovod_variables():
        treatment = _HOROVOD_TREATMENT[variable["meaning"]].format(
            knob=f"`{variable['knob']}`")
        rows.append(f"| `{variable['name']}` | {treatment} | "
                    f"{_cell(variable['note'])} |")
    return "\n".join(rows)


def _launcher_parser():
    _import_tfring()
    from tfring.launcher import cli
    from tfring.launcher import knobs
    parser = cli._parser()
    knobs.show_defaults(parser)  # as `tfringrun --help` shows them
    return parser


def tfringrun_flags():
    """Every option of tfringrun, grouped as `tfringrun --help` groups them."""
    parser = _launcher_parser()
    formatter = parser._get_formatter()
    sections = []
    for group in parser._action_groups:
        if not group._group_actions:
            continue
        title = group.title.replace("*", "\\*")
        rows = [f"**{title}**", "", "| flag | what it does |",
                "|---|---|"]
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS:
                continue
            invocation = formatter._format_action_invocation(action)
            help_text = formatter._expand_help(action) if action.help else ""
            rows.append(f"| `{invocation}` | {_cell(help_text)} |")
        sections.append("\n".join(rows))
    return "\n\n".join(sections)


def compare_table():
    """The tfring vs tf.distribute table, from the report that
    `benchmarks/compare.py --json docs/compare.json` saved."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compare.py"),
         "--markdown", str(ROOT / "docs" / "compare.json")],
        check=True, capture_output=True, text=True).stdout


GENERATORS = {
    "compare-table": compare_table,
    "environment-variables": environment_variables,
    "horovod-variables": horovod_variables,
    "tfringrun-flags": tfringrun_flags,
}


def on_page_markdown(markdown, page, config, files):
    def replace(match):
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(
                f"{page.file.src_path}: unknown generated table {name!r}; "
                f"expected one of {sorted(GENERATORS)}")
        return GENERATORS[name]()
    return MARKER.sub(replace, markdown)
