"""The one exception type for bad user input.

Every error a user can cause (an unknown task, a depth beyond the model, a
malformed data file, a store written with other settings) is raised as a
:class:`ReservoirError` whose message is one line naming what was expected and
what was found. The CLI prints that line and exits with status 2.
"""


class ReservoirError(ValueError):
    """Bad user input, reported as one line (what was expected, what was found)."""
