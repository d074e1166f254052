"""Importing tfring.mxnet where MXNet is not installed (tfring's main
environment: MXNet 1.9.1 needs NumPy < 1.24, which TensorFlow 2.21 cannot
share) fails with an ImportError that says what is missing and how to get
it, and leaves the rest of tfring importable."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mxnet") is not None,
                    reason="MXNet is installed in this environment")
def test_import_without_mxnet_names_the_fix():
    code = ("try:\n"
            "    import tfring.mxnet\n"
            "except ImportError as e:\n"
            "    print('ERROR', e)\n"
            "import tfring.common.naming, tfring.common.outcome\n"
            "print('rest ok')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "tfring.mxnet needs Apache MXNet" in out, out
    assert 'mxnet==1.9.1 "numpy<1.24"' in out and "tools/install.sh" in out, out
    assert "rest ok" in out, out
