"""Records in Redis: batches, workers and the job payload, their key names, hashes and Lua scripts, the connection,
and every use of RQ's private API."""
