# python -m tfring.migrate PATH... [--write]
#
# Prints a unified diff of each ported file (or, with --write, rewrites the
# files in place), then the uses it could not port, as file:line lines with
# the suggested path. Directories are searched for *.py files. Exit status:
# 0 when nothing needs a person, 1 when some use was listed, 2 on errors
# (a file that does not parse).

import argparse
import difflib
import pathlib
import sys


def _python_files(paths):
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            yield from sorted(path.rglob("*.py"))
        else:
            yield path


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tfring.migrate",
        description="Port Horovod TensorFlow 2 / Keras scripts to tfring "
                    "(and Keras 3 / TensorFlow 2.16+).")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="Python files or directories")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the files instead of printing a diff")
    args = parser.parse_args(argv)

    from tfring.migrate import migrate_source  # needs libcst
    from tfring.migrate._libcst import cst

    status = 0
    for path in _python_files(args.paths):
        try:
            original = path.read_text()
        except OSError as error:
            print(f"{path}: cannot read it: {error}", file=sys.stderr)
            status = 2
            continue
        try:
            result = migrate_source(original)
        except cst.ParserSyntaxError as error:
            print(f"{path}: not ported, it does not parse as Python: "
                  f"{error.message} (line {error.raw_line})", file=sys.stderr)
            status = 2
            continue
        if result.changed(original):
            if args.write:
                path.write_text(result.source)
                print(f"ported {path}")
            else:
                sys.stdout.writelines(difflib.unified_diff(
                    original.splitlines(keepends=True),
                    result.source.splitlines(keepends=True),
                    fromfile=str(path), tofile=f"{path} (tfring)"))
        for finding in result.findings:
            print(f"cannot port: {finding.format(path)}")
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
