"""The one exception type for bad input anywhere in specdraft.

Lives in `core/`, the bottom layer, so every package may raise it without depending on another. The
CLI turns it into a one-line message and exit code 2.
"""


class InputError(ValueError):
    """Bad input the user can fix: the message names the problem and the fix, on one line."""
