"""``make demo``: the whole pipeline end to end on sample events, checked against the truth."""
