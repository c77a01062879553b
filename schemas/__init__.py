"""What countersink's data looks like: counter definitions, events, CRDT kinds and the CQL schema.

Everything in this package is pure: no network, no clock reads, no logging.
"""
