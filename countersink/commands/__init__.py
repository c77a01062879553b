"""Commands that act on a deployment's counters as a whole (``drop``, ``trace``), apart from the plumbing."""
