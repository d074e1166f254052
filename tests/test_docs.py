"""The documentation site builds cleanly and covers what the code has.

`mkdocs build --strict` fails on a broken link or anchor, a page missing from
the navigation, and a docstring that does not match its signature; the
other tests check that the generated pages list every public name, knob
and flag, and that docs/troubleshooting.md explains every error tfring
raises (see tests/error_messages.py for how messages are found).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mxnet_env
from error_messages import raised_messages

ROOT = Path(__file__).resolve().parent.parent
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
# A key phrase is the first cell of a table row, in backticks.
KEY_PHRASE = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="3")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, (
        f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}")
    return out


def _page(site, name):
    return (site / name / "index.html").read_text()


def _run_python(code):
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
        text=True, check=True, timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout


# A package's public names: its __all__, else what it binds that tfring
# defines (the reduce ops are plain ints, defined by tfring too).
_PUBLIC_NAMES = (
    "import importlib, inspect, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    m = importlib.import_module(name)\n"
    "    names = getattr(m, '__all__', None) or [\n"
    "        n for n, v in vars(m).items() if isinstance(v, int)\n"
    "        or (getattr(v, '__module__', None) or '').startswith('tfring')]\n"
    "    out[name] = [n for n in names if not n.startswith('_')\n"
    "                 and not inspect.ismodule(getattr(m, n))]\n"
    "print(json.dumps(out))")
API_PAGES = {"tfring": "api/tfring", "tfring.keras": "api/keras",
             "tfring.keras.callbacks": "api/callbacks", "tfring.torch": "api/torch",
             "tfring.mxnet": "api/mxnet"}


def _assert_pages_document(site, public):
    for module, names in public.items():
        page = API_PAGES[module]
        html = _page(site, page)
        missing = [n for n in names if f'id="{module}.{n}"' not in html]
        assert not missing, f"{page} does not document {missing}"
        assert names, module


def test_api_reference_covers_every_public_name(site):
    main_environment = [m for m in API_PAGES if m != "tfring.mxnet"]
    public = json.loads(subprocess.run(
        [sys.executable, "-c", _PUBLIC_NAMES, *main_environment], cwd=ROOT,
        capture_output=True, text=True, check=True, timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout)
    _assert_pages_document(site, public)


@pytest.mark.skipif(not mxnet_env.available(), reason=mxnet_env.MISSING_REASON)
def test_mxnet_api_reference_covers_every_public_name(site, tmp_path):
    # tfring.mxnet imports only in the MXNet environment (tests/mxnet_env.py).
    overlay = mxnet_env.make_overlay(tmp_path)
    public = json.loads(subprocess.run(
        [str(mxnet_env.PYTHON), "-c", _PUBLIC_NAMES, "tfring.mxnet"], cwd=overlay,
        capture_output=True, text=True, check=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(overlay))).stdout)
    _assert_pages_document(site, public)


def test_environment_page_lists_every_knob_with_its_default(site):
    html = _page(site, "environment")
    knobs = json.loads(_run_python(
        "import json, tfring._core as c; print(json.dumps(c.config()))"))
    assert knobs
    for knob in knobs:
        default = knob["default"] or '""'
        row = re.search(rf"<td><code>{knob['env']}</code></td>\s*"
                        rf"<td>([^<]*)</td>", html)
        assert row, f"{knob['env']} is missing from the environment page"
        assert row.group(1) == default, (knob["env"], row.group(1), default)


def test_tfringrun_page_lists_every_flag(site):
    html = _page(site, "tfringrun")
    flags = _run_python(
        "from tfring.launcher import cli\n"
        "for a in cli._parser()._actions:\n"
        "    print('\\n'.join(a.option_strings))").split()
    assert "--fusion-threshold-mb" in flags and "--check-build" in flags
    for flag in flags:
        assert flag in html, f"{flag} is missing from the tfringrun page"


def test_benchmarks_page_has_the_compare_table(site):
    html = _page(site, "benchmarks")
    measured = json.loads((ROOT / "docs" / "compare.json").read_text())["date"]
    assert "MWMS, RING" in html and measured in html


def _key_phrases():
    return KEY_PHRASE.findall(TROUBLESHOOTING.read_text())


def test_every_raised_error_has_a_key_phrase_on_the_troubleshooting_page():
    phrases = _key_phrases()
    messages = raised_messages()
    assert len(messages) > 100  # the scan itself still finds the errors
    unexplained = [f"{path}:{line}: {text}" for path, line, text in messages
                   if not any(phrase in text for phrase in phrases)]
    assert not unexplained, (
        "errors missing from docs/troubleshooting.md (add a row whose key "
        "phrase is part of the message):\n" + "\n".join(unexplained))


def test_every_key_phrase_still_matches_an_error():
    texts = [text for _, _, text in raised_messages()]
    stale = [p for p in _key_phrases() if not any(p in t for t in texts)]
    assert not stale, f"key phrases that match no error any more: {stale}"
