"""The one exception type for bad input anywhere in specdraft.

Lives in `decoding/` because that is the lowest layer (every other package may import it, and the
decoder must not import `pipelines`). The CLI turns it into a one-line message and exit code 2.
"""


class InputError(ValueError):
    """Bad input the user can fix: the message names the problem and the fix, on one line."""
