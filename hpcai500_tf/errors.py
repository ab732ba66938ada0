"""The one exception type for mistakes a user can fix, the argument parser that reports a
mistyped command the same way (one line, exit 2), and how such a line is printed: every path
and string a user gave in it shown as text (`one_line`), never as terminal control."""

import argparse
from typing import NoReturn

from hpcai500_tf.report.text import printable


class UserError(Exception):
    """Bad input (file, config, argument): reported as one line, non-zero exit, no traceback."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line naming it (and where the help is),
    exit 2, as every other user error, instead of the usage block and then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: object) -> str:
    """`message` as one printable line: control characters (ESC, CR, a bell), unpaired
    surrogates and line breaks written as escapes (report.text.printable), so that a path
    holding them can neither drive the terminal nor break the line in two."""
    return printable(str(message).replace("\n", "\\n").replace("\t", "\\t"))


def first_line(error: BaseException) -> str:
    """An error's name and the first line of its message, at most 200 characters: how a
    library's error is quoted inside a one-line UserError."""
    lines = str(error).strip().splitlines()
    return f"{error.__class__.__name__}: {lines[0][:200] if lines else ''}"
