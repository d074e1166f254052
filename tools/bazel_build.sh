#!/usr/bin/env bash
# Builds tfring's native targets with Bazel and runs the C++ core tests.
#
# Uses Debian's bazel-bootstrap (Bazel 4.2.3, offline; see WORKSPACE for the
# work-arounds) and installs it with apt-get if it is missing. The repository
# rules take TensorFlow, pybind11 and MPI from $TFRING_PYTHON,
# $PYTHON_BIN_PATH or .venv/bin/python (run tools/install.sh first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v bazel >/dev/null || [[ ! -d /usr/share/bazel/rules/java ]]; then
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "bazel_build.sh: Bazel is not installed. Install Debian's bazel-bootstrap and" \
         "bazel-rules-java (apt-get install bazel-bootstrap bazel-rules-java) as root." >&2
    exit 1
  fi
  echo "[bazel] installing bazel-bootstrap and bazel-rules-java with apt-get"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bazel-bootstrap bazel-rules-java >/dev/null
fi

targets=(//:tfring_core //:tfring_core_module //:tfring_ops //:tfring_loopback_listeners)
echo "[bazel] bazel build ${targets[*]}"
bazel build --noshow_progress "${targets[@]}"

if compgen -G "tests/cc/*.cc" >/dev/null; then
  tests=(//tests/cc:core_logic_test //tests/cc:free_buffer_cache_test
         //tests/cc:autotune_test //tests/cc:shm_collectives_test
         //tests/cc:config_test //tests/cc:output_file_test
         //tests/cc:wire_compression_test_size1 //tests/cc:wire_compression_test_size2
         //tests/cc:wire_compression_test_size4)
  echo "[bazel] bazel test ${tests[*]}"
  bazel test --noshow_progress "${tests[@]}"
else
  echo "[bazel] no tests/cc/*.cc yet: skipping //tests/cc:core_logic_test"
fi
