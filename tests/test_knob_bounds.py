"""tfringrun's settings flags refuse what the core would refuse: each
numeric flag's largest value (tfring/launcher/knobs.py) is the core's bound
for its variable (cc/config.h, listed by tfring._core.config()), values up
to it pass and anything above it is a usage error naming the flag's unit and
the variable (before, `--shm-bytes 9223372036854775807` was passed on and
every rank crashed).
"""
import pytest

from tfring import _core
from tfring.launcher import cli
from tfring.launcher import knobs

CORE = {entry["env"]: entry for entry in _core.config()}
NUMERIC = [k for k in knobs.KNOB_FLAGS
           if k.kind is not None and k.kind not in (knobs.PATH, knobs.TEXT)]


def test_every_numeric_flag_has_the_cores_bound():
    assert NUMERIC
    for knob in NUMERIC:
        core = CORE[knob.env]
        assert core["type"] in ("integer", "number"), knob.env
        assert knob.maximum is not None, knob.flags[0]
        assert float(knob.maximum) == float(core["maximum"]), (
            knob.flags[0], knob.maximum, core["maximum"])
    # Text and path flags set variables without a bound.
    for knob in knobs.KNOB_FLAGS:
        if knob.kind in (knobs.PATH, knobs.TEXT) and not knob.choices:
            assert CORE[knob.env]["maximum"] == "", knob.env


@pytest.mark.parametrize("knob", NUMERIC, ids=lambda k: k.flags[0])
def test_the_largest_value_passes_and_the_next_is_refused(knob, capsys):
    largest = knob.maximum / knob.kind.scale
    shown = knobs._plain(float(largest))
    args = cli.parse_args(["-np", "2", knob.flags[0], shown, "p"])
    assert float(getattr(args, knob.dest)) == knob.maximum
    above = knobs._plain(float(largest * 2))
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["-np", "2", knob.flags[0], above, "p"])
    assert e.value.code == 2
    assert (f"got '{above}'; expected at most {shown} "
            f"{knob.kind.unit}, the largest value {knob.env} takes"
            in capsys.readouterr().err)


def test_a_huge_shm_slot_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["-np", "2", "--shm-bytes", "9223372036854775807", "p"])
    assert ("expected at most 1099511627776 bytes, the largest value TFRING_SHM_BYTES takes"
            in capsys.readouterr().err)
