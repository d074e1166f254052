# Building and running the standalone C++ test binaries of tests/cc from
# pytest: one place that knows the compile line, how a binary's scenario
# table is read (so collection needs no compiled binary) and what a passing
# run prints (tests/cc/expect.h's RunScenarios).

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_binary(output_path, test_source, sources, flags=("-O1", "-g"), libraries=()):
    """Compiles `test_source` with `sources` into `output_path`; fails the
    test with the compiler's output if it does not build."""
    command = [os.environ.get("TFRING_CXX", "g++"), "-std=c++17", *flags, "-pthread",
               "-Wall", "-I", ROOT, "-o", str(output_path), str(test_source),
               *(str(s) for s in sources), *libraries]
    compiled = subprocess.run(command, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr[-4000:]
    return output_path


def scenario_names(test_source, table_start):
    """The quoted names in the table that follows `table_start` in the C++
    source, up to its closing `};`."""
    with open(test_source) as f:
        table = f.read().split(table_start, 1)[1].split("};", 1)[0]
    return [line.split('"')[1] for line in table.splitlines() if '{"' in line]


def run_scenario(binary, args, passed_line, timeout, env=None):
    """Runs the binary with `args`; asserts it exits 0 and prints `passed_line`."""
    result = subprocess.run([str(binary), *args], capture_output=True, text=True,
                            timeout=timeout, env=env)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert passed_line in result.stdout, result.stdout[-4000:]
    return result
