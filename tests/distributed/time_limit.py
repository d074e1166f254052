"""A call that must return within a time limit, for tests of collectives
that hang (instead of failing) when the ranks do not pair them up."""

import threading

DEFAULT_SECONDS = 60


def within_time_limit(fn, *args, seconds=DEFAULT_SECONDS):
    """fn(*args); fails the test if it has not returned within `seconds`
    (the ranks did not pair up their collectives). The call goes on in a
    daemon thread: the failing test aborts the job (conftest), which ends
    it."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn(*args)
        except BaseException as error:  # re-raised below
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), (
        f"still waiting after {seconds} s: the ranks did not pair up their "
        "collectives")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
