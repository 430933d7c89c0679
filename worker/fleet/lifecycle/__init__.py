"""A batch's life after submit: cancel and retry, expiry at the end of its window, what Redis keeps once it has
ended, and the periodic duties (housekeeping.py) that every worker and `miro serve` run."""
