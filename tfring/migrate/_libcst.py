# The one place the porting tool imports libcst, so a missing install is one
# clear error rather than a traceback from whichever rewrite loads first.

try:
    import libcst  # noqa: F401
    import libcst.matchers  # noqa: F401
    import libcst.metadata  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        "python -m tfring.migrate needs libcst, which is not installed "
        f"({error}). It rewrites scripts through libcst's concrete syntax "
        "tree so comments and formatting survive. Install it with "
        "`pip install libcst` (or `pip install tfring[migrate]`).") from None

cst = libcst
m = libcst.matchers
metadata = libcst.metadata
