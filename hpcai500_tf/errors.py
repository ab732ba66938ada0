"""The one exception type for mistakes a user can fix, and the argument parser that reports a
mistyped command the same way: one line, exit 2."""

import argparse
from typing import NoReturn


class UserError(Exception):
    """Bad input (file, config, argument): reported as one line, non-zero exit, no traceback."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line naming it (and where the help is),
    exit 2, as every other user error, instead of the usage block and then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def first_line(error: BaseException) -> str:
    """An error's name and the first line of its message, at most 200 characters: how a
    library's error is quoted inside a one-line UserError."""
    lines = str(error).strip().splitlines()
    return f"{error.__class__.__name__}: {lines[0][:200] if lines else ''}"
