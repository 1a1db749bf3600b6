"""What the check scripts run in subprocesses (shard_check.py, distributed_check.py) share:
a record of named measurements with the list of failed checks, and the relative error."""

import numpy as np

RESULTS: dict = {}
FAILED: list = []


def check(name, value, ok):
    """Record ``value`` under ``name``; remember the name if ``ok`` is false."""
    RESULTS[name] = value
    if not ok:
        FAILED.append(name)


def rel(a, b):
    """max |a − b| / max |b|."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
