# Each host's newest commit() on that host's disk, so that an elastic job
# tfringrun starts again after losing a host resumes from it.
#
# Why: when a host's PRRTE daemon dies, PRRTE 3.0 ends every rank of the job
# (docs/elastic.md), and the commits held in memory die with them. The first
# rank of each host writes the state it saved at each commit to
# <directory>/<host>.commit from a thread of its own: commit() does not wait
# for the disk, and a commit taken while the previous one is still being
# written replaces the one waiting, so the newest goes next. After each
# write it rests 19 times as long as the write took, so that keeping costs
# the host at most a twentieth of a core (a commit every few steps of a
# small model would otherwise keep the thread writing); the commit a
# restart finds is then at most that rest older than the last. It writes a
# temporary file and renames it over the last one, so a rank killed
# mid-write leaves the previous commit whole. Arrays go out as they are
# (pickle protocol 5, out of band): no copy of the model is made for the
# file. After a restart every rank reads its host's file, the ranks agree on
# the newest commit kept anywhere, and its holder broadcasts it
# (tfring/elastic/runner.py).

import os
import pickle
import socket
import struct
import sys
import threading
import time

from tfring.elastic import settings as _settings

_MAGIC = b"TFRINGC1"
# The writer rests this many times as long as its last write took.
_REST_PER_WRITE = 19
_WORD = struct.Struct("<Q")


def _write_file(path, number, snapshot):
    buffers = []
    header = pickle.dumps((number, snapshot), protocol=5,
                          buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    temporary = f"{path}.{os.getpid()}.writing"
    with open(temporary, "wb") as f:
        f.write(_MAGIC)
        f.write(_WORD.pack(len(header)))
        f.write(_WORD.pack(len(raws)))
        for raw in raws:
            f.write(_WORD.pack(raw.nbytes))
        f.write(header)
        for raw in raws:
            f.write(raw)
    os.replace(temporary, path)


def _read_exactly(f, count):
    data = f.read(count)
    if len(data) != count:
        raise ValueError(f"damaged commit file: it ends after {len(data)} "
                         f"of {count} bytes")
    return data


def _read_file(path):
    with open(path, "rb") as f:
        if _read_exactly(f, len(_MAGIC)) != _MAGIC:
            raise ValueError("damaged commit file: no tfring commit")
        header_bytes = _WORD.unpack(_read_exactly(f, _WORD.size))[0]
        count = _WORD.unpack(_read_exactly(f, _WORD.size))[0]
        sizes = [_WORD.unpack(_read_exactly(f, _WORD.size))[0]
                 for _ in range(count)]
        header = _read_exactly(f, header_bytes)
        buffers = []
        for size in sizes:
            buffer = bytearray(size)
            if f.readinto(buffer) != size:
                raise ValueError("damaged commit file: it ends inside an array")
            buffers.append(buffer)
    return pickle.loads(header, buffers=buffers)


class KeptCommits:
    """This host's file of kept commits in `directory` (named after `host`,
    default this machine's host name)."""

    def __init__(self, directory, host=None):
        self.directory = directory
        self.host = host or socket.gethostname()
        self.path = os.path.join(directory, f"{self.host}.commit")
        self._changed = threading.Condition()
        self._waiting = None
        self._writing = False
        self._writer = None
        self._warned = False
        self._not_before = 0.0  # time.monotonic() of the next write

    def keep(self, number, snapshot):
        """Writes commit `number` (its `snapshot`, which nobody changes
        afterwards) once the writer has rested from its last write,
        replacing one still waiting to be written."""
        with self._changed:
            self._waiting = (number, snapshot)
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_newest, name="tfring-kept-commit",
                    daemon=True)
                self._writer.start()
            self._changed.notify_all()

    def _write_newest(self):
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting is not None)
            # Commits taken during the rest replace the one waiting.
            time.sleep(max(0.0, self._not_before - time.monotonic()))
            with self._changed:
                if self._waiting is None:
                    continue  # remove() dropped it
                (number, snapshot), self._waiting = self._waiting, None
                self._writing = True
            started = time.monotonic()
            try:
                os.makedirs(self.directory, exist_ok=True)
                _write_file(self.path, number, snapshot)
            except (OSError, pickle.PicklingError, TypeError) as e:
                self._warn(f"could not write commit {number} to {self.path} "
                           f"({e})")
            finally:
                ended = time.monotonic()
                self._not_before = ended + _REST_PER_WRITE * (ended - started)
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()

    def wait(self, timeout=None):
        """Waits until every commit given to keep() is written; False when
        `timeout` seconds ran out first."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._waiting is None and not self._writing, timeout)

    def read(self):
        """(number, snapshot) of the commit kept here, or None when there is
        none (or it cannot be read: a warning says why)."""
        if not os.path.exists(self.path):
            return None
        try:
            return _read_file(self.path)
        except (OSError, ValueError, EOFError, pickle.UnpicklingError,
                struct.error) as e:
            self._warn(f"could not read the commit kept in {self.path} ({e})")
            return None

    def remove(self):
        """Drops a commit still waiting, waits for one being written and
        deletes this host's file (the directory too once it is empty): the
        job finished and will not start again."""
        with self._changed:
            self._waiting = None
        self.wait()
        try:
            os.remove(self.path)
        except OSError:
            pass  # never written, or gone already
        try:
            os.rmdir(self.directory)
        except OSError:
            pass  # gone already, or another host's file is still there

    def _warn(self, what):
        if self._warned:
            return
        self._warned = True
        print(f"tfring elastic: {what}. A job started again after a lost "
              "host resumes from an older commit, or from the program's "
              "start. Point --elastic-commit-dir at a writable local "
              "directory with room for the model, or pass "
              "--elastic-commit-dir none to keep commits in memory only.",
              file=sys.stderr, flush=True)


_kept = None


def for_this_job():
    """The KeptCommits of this process's host in the directory tfringrun
    chose (TFRING_ELASTIC_COMMIT_DIR), or None where commits stay in memory
    only (not launched elastic, or --elastic-commit-dir none)."""
    global _kept
    settings = _settings.from_environment()
    if not settings.enabled or not settings.commit_dir:
        return None
    if _kept is None or _kept.directory != settings.commit_dir:
        _kept = KeptCommits(settings.commit_dir)
    return _kept
