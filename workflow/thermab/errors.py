"""The one error type for a user's mistake (a config key, a file, an argument).

``python -m thermab`` answers it with its one-line message and exit status 2, without a
traceback (``--debug`` shows one); anything else is a bug and keeps its traceback."""


class UserError(Exception):
    """Something the user gave is wrong; the message, one line, names the file or key."""
