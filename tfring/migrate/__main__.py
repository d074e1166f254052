# python -m tfring.migrate PATH... [--write]
#
# Prints a unified diff of each ported file (or, with --write, rewrites the
# files, each in one rename: files.py), then the uses it could not port, as
# file:line lines with the suggested path. Directories are searched for
# *.py files; symbolic links that lead out of a directory are skipped, and
# listed. Exit status: 0 when nothing needs a person, 1 when some use or
# skipped link was listed, 2 on errors (a file that does not parse or
# cannot be read or written).

import argparse
import difflib
import sys

from tfring.migrate import files as _files


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tfring.migrate",
        description="Port Horovod TensorFlow 2 / Keras and PyTorch scripts "
                    "to tfring (and to Keras 3 / TensorFlow 2.16+, torch 2.x).")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="Python files or directories")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the files instead of printing a diff")
    args = parser.parse_args(argv)

    from tfring.migrate import migrate_source  # needs libcst
    from tfring.migrate._libcst import cst

    status = 0
    for candidate in _files.python_files(args.paths):
        path = candidate.path
        if candidate.skipped:
            print(f"not ported: {candidate.skipped}")
            status = max(status, 1)
            continue
        try:
            original = _files.read_source(candidate.target)
        except (OSError, UnicodeDecodeError) as error:
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
                try:
                    _files.write_atomically(candidate.target, result.source)
                except OSError as error:
                    print(f"{path}: not ported, cannot write "
                          f"{candidate.target}: {error}", file=sys.stderr)
                    status = 2
                    continue
                print(f"ported {candidate.target} (through the link {path})"
                      if path.is_symlink() else f"ported {path}")
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
