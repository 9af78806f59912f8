"""LongMemEval: a loader for the user's own copy of the data set (not redistributed)."""
