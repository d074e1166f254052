"""Which Python the repository rules ask about TensorFlow, pybind11 and MPI.

The same interpreter tfring is installed into: $TFRING_PYTHON, else
$PYTHON_BIN_PATH, else the workspace's .venv/bin/python, else python3 on PATH.
"""

PYTHON_ENVIRON = ["TFRING_PYTHON", "PYTHON_BIN_PATH"]

def find_python(repository_ctx):
    for var in PYTHON_ENVIRON:
        value = repository_ctx.os.environ.get(var, "")
        if value:
            found = repository_ctx.path(value) if "/" in value else repository_ctx.which(value)
            if found == None or not found.exists:
                fail("%s=%s: no such Python interpreter" % (var, value))
            return found
    workspace = repository_ctx.path(Label("//:WORKSPACE")).dirname
    venv = workspace.get_child(".venv").get_child("bin").get_child("python")
    if venv.exists:
        return venv
    python3 = repository_ctx.which("python3")
    if python3 == None:
        fail("no Python found: set TFRING_PYTHON to the interpreter that has " +
             "TensorFlow, pybind11 and the Open MPI wheel installed " +
             "(tools/install.sh creates .venv/bin/python).")
    return python3

def run_python(repository_ctx, python, code, what):
    """Runs `code` with `python`; returns its stdout lines or fails naming `what`."""
    result = repository_ctx.execute([python, "-c", code])
    if result.return_code != 0:
        fail("%s: running %s failed:\n%s\n%s" % (what, python, result.stdout, result.stderr))
    return result.stdout.strip().splitlines()
