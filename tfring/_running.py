# Whether the core runs, and the error an API call raises when it does not.
#
# Why its own module: basics.py starts and stops the core and has
# process_sets.py work out the sets at init(), and process_sets.py needs the
# same check and this rank; kept here, neither imports the other for it.

from tfring import _core
from tfring import errors

# True after shutdown(), so later calls can say "shut down" rather than
# "not initialized".
_shut_down = False


def set_shut_down(value):
    global _shut_down
    _shut_down = bool(value)


def check_initialized(api_name):
    """Raises ValueError naming `api_name` unless tfring runs."""
    if not _core.is_initialized():
        raise errors.not_initialized(api_name, _shut_down)


def rank(api_name="tfring.rank()"):
    """This process's rank; ValueError naming `api_name` before init()."""
    check_initialized(api_name)
    return _core.rank()


def size(api_name="tfring.size()"):
    """The number of ranks; ValueError naming `api_name` before init()."""
    check_initialized(api_name)
    return _core.size()
