"""The one exception type users see: its message names the problem and the fix."""


class BevyError(Exception):
    """A user-facing error. The CLI prints `error: <message>` and exits non-zero, no traceback."""
