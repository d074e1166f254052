# tfring does not need torch: without it, `import tfring` works and
# `import tfring.torch` fails with an ImportError that says how to install
# it; with it, importing tfring.torch loads no TensorFlow.

import subprocess
import sys

import mpi_launch

_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # as if torch were not installed
import tfring
try:
    import tfring.torch
except ImportError as e:
    print("ImportError:", e)
"""

_NO_TENSORFLOW = """
import sys
import tfring.torch
print("tensorflow loaded:", "tensorflow" in sys.modules)
"""


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300,
                          env=mpi_launch.working_tree_env(
                              quiet_tensorflow=True))


def test_import_without_torch_says_how_to_install_it():
    result = _run(_WITHOUT_TORCH)
    assert result.returncode == 0, result.stderr
    assert "ImportError: tfring.torch needs PyTorch" in result.stdout
    assert "pip install torch" in result.stdout


def test_tfring_torch_loads_no_tensorflow():
    import pytest
    pytest.importorskip("torch")
    result = _run(_NO_TENSORFLOW)
    assert result.returncode == 0, result.stderr
    assert "tensorflow loaded: False" in result.stdout
