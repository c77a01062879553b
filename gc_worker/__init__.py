"""The GC worker: folds the shards of retired mutators into one tally per counter instance."""
