"""README.md stays true: its commands match CI, and every knob is documented."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    command = ci_lines[-1].strip()
    assert command in README, f"README must show the CI test command: {command}"


def test_every_config_knob_is_documented_with_its_default():
    # tfring._core lists the knobs from cc/config.h, the one place they live.
    listing = subprocess.run(
        [sys.executable, "-c",
         "import tfring._core as c\n"
         "for e in c.config(): print(e['env'], e['default'], sep='\\t')"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        env, _, default = line.partition("\t")
        default = default or '""'  # an empty string, as README shows it
        row = re.search(rf"^\| `{env}` \| ([^|]+) \|", README, re.MULTILINE)
        assert row, f"{env} is missing from README's environment table"
        assert row.group(1).strip() == default, (env, row.group(1), default)
