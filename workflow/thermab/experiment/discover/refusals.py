"""discover's two user errors: both exit 2 with one line."""

from thermab.errors import UserError


class UsageError(UserError):
    """A wrong flag or argument: one line naming it, exit 2."""


class Question(UserError):
    """A choice only the user can make: the candidates and the flag that picks one, exit 2."""
