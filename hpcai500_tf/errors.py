"""The one exception type for mistakes a user can fix: the CLI prints it as one line."""


class UserError(Exception):
    """Bad input (file, config, argument): reported as one line, non-zero exit, no traceback."""
