# Which files `python -m tfring.migrate` ports, and how it writes them.
#
# Why a module: the tool is run as root on trees it did not make (a
# checkout, a shared scripts folder). A `.py` symbolic link in such a tree
# may point anywhere: the tool ports a file under a folder it was given only
# when the file really lies inside that folder, and it never leaves a file
# half written: the new text goes to a temporary file in the same folder
# (same mode, same owner where allowed), which is then renamed over the
# old one.

import dataclasses
import os
import pathlib
import stat
import tempfile


@dataclasses.dataclass(frozen=True)
class Candidate:
    path: pathlib.Path            # as found (or named on the command line)
    target: pathlib.Path          # the file read and written
    skipped: str = ""             # why it is not ported, when it is not


def python_files(paths):
    """The Candidates for the command's PATH arguments: a file named on
    the command line is ported (through its link, if it is one); under a
    folder, every *.py file that lies inside the folder once symbolic links
    are resolved, each once."""
    seen = set()
    for path in map(pathlib.Path, paths):
        if not path.is_dir():
            yield Candidate(path, path.resolve())
            continue
        root = path.resolve()
        for found in sorted(path.rglob("*.py")):
            if found.is_dir():
                continue
            target = found.resolve()
            if not target.is_relative_to(root):
                yield Candidate(found, target, skipped=(
                    f"{found} is a symbolic link to {target}, outside "
                    f"{path}: name the file itself to port it"))
            elif target not in seen:
                seen.add(target)
                yield Candidate(found, target)


def read_source(path):
    """The file's text, line endings as they are (UTF-8, Python's default
    source encoding)."""
    with open(path, encoding="utf-8", newline="") as file:
        return file.read()


def write_atomically(path, text):
    """Replaces the file's content by `text` in one rename: a reader sees
    the old file or the new one, never a part. The new file keeps the old
    one's mode, and its owner and group where this process may set them."""
    path = pathlib.Path(path)
    old = os.stat(path)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tfring-migrate")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.chown(temporary, old.st_uid, old.st_gid)
        except PermissionError:
            pass  # not root: the file becomes ours, as any edit would make it
        os.chmod(temporary, stat.S_IMODE(old.st_mode))  # after chown, which clears setuid
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
