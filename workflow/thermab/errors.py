"""The package's one tree of errors: what went wrong, said in a message that names it.

    ThermabError
    ├── UserError     what the user gave (a config key, an argument, a file): exit 2, one line
    ├── HostError     a host could not be used (transport, host key, patch, agent)
    └── StageFailed   a stage did not do its work (preflight, readiness, load, a phase, the end)

A ThermabError's message says all there is to say, so ``jobs.logged`` prints it without a
traceback and ``python -m thermab`` with its status; any other exception is a bug and keeps
its traceback.  HostError and StageFailed are RuntimeErrors, as the classes they became the
bases of were.  Outside the tree on purpose: the agent's SettingsError and MatchTimeout
(the agent ships as one stdlib file; the patcher turns a MatchTimeout into a PatchError)
and the simulated server's ApiError and EngineGone (they never leave it)."""

from __future__ import annotations


class ThermabError(Exception):
    """The root: an expected failure whose message names its cause."""


class UserError(ThermabError):
    """Something the user gave is wrong (a config key, a file, an argument); the message,
    one line, names it.  ``python -m thermab`` answers it with exit status 2 and no
    traceback."""


class HostError(ThermabError, RuntimeError):
    """A host could not be reached, trusted, patched or watched; the message names the host."""


class StageFailed(ThermabError, RuntimeError):
    """A stage could not do its work (preflight, the server's readiness, a load, a phase)."""


USER_ERROR, FAILED = 2, 1  # exit statuses of a UserError and of any other ThermabError


def exit_status(error: ThermabError) -> int:
    return USER_ERROR if isinstance(error, UserError) else FAILED
