"""The one error a user can fix.

Every error that bad input, a bad config, a bad model directory or an unusable outbox
can cause derives from `UserError`: the CLI prints it as one line (`error: ...`) and
exits 2. Anything else is a bug and shows its traceback (exit 1).
"""


class UserError(Exception):
    """Something the user can fix; the message is one line that says what and where."""
