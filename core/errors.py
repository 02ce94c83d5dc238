"""The one exception type for bad input anywhere in specdraft.

Lives in `core/`, the bottom layer, so every package may raise it without depending on another. The
CLI turns it into a one-line message and exit code 2.
"""


class InputError(ValueError):
    """Bad input the user can fix: the message names the problem and the fix, on one line."""


def require_int(value, name: str, minimum: int = 1, hint: str = "") -> None:
    """InputError unless `value` is an int >= minimum (bool refused: True is an int to Python, not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}" + (f"; {hint}" if hint else ""))
