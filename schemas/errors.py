"""Every exception countersink raises on purpose derives from :class:`CountersinkError`.

Pure code raises these; the I/O layers decide whether to retry, dead-letter or stop. ``retriable`` says
whether trying the same operation again can succeed.
"""


class CountersinkError(Exception):
    """Root of every error countersink raises on purpose."""

    retriable = False
