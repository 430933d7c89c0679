"""From a dataset to jobs: reading and validating lines, storing the requests (spool), choosing the model's queues,
and feeding RQ jobs a chunk at a time."""
