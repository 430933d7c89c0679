"""How miro changes Redis atomically, in one place: every Lua script it runs, and its one WATCH/MULTI retry loop.

Each script is a redis-py Script: Redis compiles it once (SCRIPT LOAD, on first use per server) and later calls
send only its SHA1 (EVALSHA); a call through a pipeline loads it when the pipeline runs. Call one as
``SCRIPT(client, keys, args)``; ``client`` may be a connection or a pipeline.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import redis
from redis.commands.core import Script

from miro.core.errors import MiroError

T = TypeVar("T")


class Lua:
    """One Lua script, shared by every connection (its source as bytes: no client needed to hash it)."""

    def __init__(self, source: str):
        self.script = Script(None, source.strip().encode())

    def __call__(self, client, keys: Sequence, args: Sequence = ()):
        return self.script(keys=list(keys), args=list(args), client=client)


def watched(
    conn: redis.Redis,
    watch: Sequence[str],
    attempt: Callable[[redis.client.Pipeline], T],
    what: str,
    attempts: int = 100,
) -> T:
    """Run `attempt(pipe)` on a transaction pipeline that WATCHes `watch` first: it reads what it needs (with
    `conn`), then pipe.multi(), queues its writes and pipe.execute(), and returns what to report. If a
    watched key changed in between, EXEC fails and it runs again; after `attempts`, MiroError naming `what`."""
    with conn.pipeline(transaction=True) as pipe:
        for _ in range(attempts):
            try:
                pipe.watch(*watch)
                return attempt(pipe)
            except redis.WatchError:  # EXEC failed (and reset the pipeline): read again
                continue
    raise MiroError(f"{what} kept changing while miro read it; try again.")


# KEYS[1] batch hash; ARGV: new status, timestamp, allowed previous statuses... -> {previous status, changed}
SET_STATUS = Lua("""
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {'', 0} end
if cur == ARGV[1] then return {cur, 0} end
for i = 3, #ARGV do
  if ARGV[i] == cur then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2])
    return {cur, 1}
  end
end
return {cur, -1}
""")

# KEYS: batch hash, invalid hash; ARGV: custom id, JSON record -> 1 if recorded now, 0 if it already was
RECORD_FAILED = Lua("""
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'total', 1)
  redis.call('HINCRBY', KEYS[1], 'failed', 1)
  return 1
end
return 0
""")

# KEYS: batch hash, set of custom ids already counted, the ended-batches set, the batch deadlines, the batch releases;
# ARGV: counter to add to, prompt tokens, cached prompt tokens, completion tokens, timestamp, batch id, then the custom
# ids. A request counts once even if it ran twice (its worker died after writing its row). Once every request is
# accounted for, an in_progress batch passes through finalizing to completed, a cancelling one becomes cancelled and an
# expiring one expired, the batch id joins the ended set (`miro serve` writes its files), leaves the deadlines and
# joins the releases, scored by now (release.py deletes its jobs' keys), and loses its counted_pinned mark. A batch
# whose set went to storage (counted_stored, counted.py) counts nothing: it had counted every request. Returns
# {requests newly counted, completed+failed+cancelled}.
COUNT = Lua("""
local added = 0
if not redis.call('HGET', KEYS[1], 'counted_stored') then  -- stored (counted.py): the batch counted every request
  for i = 7, #ARGV do added = added + redis.call('SADD', KEYS[2], ARGV[i]) end
end
if added > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], added)
  redis.call('HINCRBY', KEYS[1], 'prompt_tokens', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'cached_tokens', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'completion_tokens', ARGV[4])
end
local b = redis.call('HMGET', KEYS[1], 'completed', 'failed', 'cancelled', 'total', 'status')
if not b[4] then return {added, 0} end
local done = tonumber(b[1]) + tonumber(b[2]) + tonumber(b[3] or '0')
if done >= tonumber(b[4]) then
  local settled = nil
  if b[5] == 'in_progress' then
    redis.call('HSET', KEYS[1], 'status', 'completed', 'finalizing_at', ARGV[5], 'completed_at', ARGV[5])
    settled = true
  elseif b[5] == 'cancelling' then
    redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancelled_at', ARGV[5])
    settled = true
  elseif b[5] == 'expiring' then
    redis.call('HSET', KEYS[1], 'status', 'expired', 'expired_at', ARGV[5])
    settled = true
  end
  if settled then
    redis.call('HDEL', KEYS[1], 'counted_pinned')  -- its counted set may move to storage again (counted.py)
    redis.call('SADD', KEYS[3], ARGV[6])
    redis.call('ZREM', KEYS[4], ARGV[6])
    redis.call('ZADD', KEYS[5], ARGV[5], ARGV[6])
  end
end
return {added, done}
""")

# KEYS: batch hash, counted set; ARGV: counter, custom id. The request will run again: take it back out of
# the counter it was counted in (only if it was counted: a job RQ gave up on was never counted).
UNCOUNT = Lua("""
if redis.call('SREM', KEYS[2], ARGV[2]) == 1 then redis.call('HINCRBY', KEYS[1], ARGV[1], -1) return 1 end
return 0
""")

# KEYS: a hash; ARGV: field, now (epoch seconds), how long a claim holds. Sets the field to now if it is not set or
# was set longer ago than that (its holder died); returns 1 if the caller now holds the claim, 0 if another does.
CLAIM = Lua("""
local since = redis.call('HGET', KEYS[1], ARGV[1])
if since and tonumber(ARGV[2]) - tonumber(since) < tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
""")

# KEYS: the deadlines sorted set, batch hash; ARGV: batch id, when to look at it next, the ended statuses...
# Looks at the batch again at that time unless it has ended meanwhile (COUNT takes an ended batch off the
# deadlines; a plain ZADD after it would put it back). Returns 1 if re-armed, 0 if it had ended.
REARM_DEADLINE = Lua("""
local status = redis.call('HGET', KEYS[2], 'status')
for i = 3, #ARGV do
  if status == ARGV[i] then redis.call('ZREM', KEYS[1], ARGV[1]) return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
""")

# KEYS: a lock key; ARGV: the holder's token. Deletes the lock only if that holder still has it (expiry.py).
RELEASE_LOCK = Lua("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")

# KEYS: the worker's last-take key, then pairs of (queue list, its intermediate list), most urgent queue first;
# ARGV: the last-take key's TTL (s) -> {queue key, job id} of the job at the head of the first non-empty queue, moved
# onto that queue's intermediate list in the same step, or nil. A worker killed between taking a job and starting it
# leaves the id there, and RQ's maintenance queues it again (IntermediateQueue.cleanup); BLPOP over several queues
# would leave it nowhere. The take is also written to the last-take key, so a worker whose reply Redis lost (it went
# away mid-call) finds the job it took once Redis answers (worker/process/taking.py).
TAKE_NEXT_JOB = Lua("""
for i = 2, #KEYS, 2 do
  local job_id = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'LEFT', 'RIGHT')
  if job_id then
    redis.call('SET', KEYS[1], KEYS[i] .. ' ' .. job_id, 'EX', ARGV[1])
    return {KEYS[i], job_id}
  end
end
return nil
""")

# KEYS: an earlier version's priority queue list (`Q:high`), today's (`Q/high`), the rq:queues set; ARGV: the two
# queue names, the priority, the batch key prefix, the job key prefix. Moves the jobs whose batch records the old queue
# and that priority onto the new queue (in order; the others keep theirs), with it as their origin (where RQ puts an
# abandoned job back), and records the new queue in those batches; returns how many.
MIGRATE_QUEUE = Lua("""
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
local keep, moved, batches = {}, {}, {}
for _, id in ipairs(ids) do
  local batch_id = string.match(id, '^(batch_%x+)%-')
  local ours = false
  if batch_id then
    local b = redis.call('HMGET', ARGV[4] .. batch_id, 'queue', 'priority')
    ours = b[1] == ARGV[1] and b[2] == ARGV[3]
  end
  if ours then
    moved[#moved + 1] = id
    batches[batch_id] = true
    redis.call('HSET', ARGV[5] .. id, 'origin', ARGV[2])
  else
    keep[#keep + 1] = id
  end
end
if #moved > 0 then
  redis.call('DEL', KEYS[1])
  for i = 1, #keep, 1000 do
    redis.call('RPUSH', KEYS[1], unpack(keep, i, math.min(i + 999, #keep)))
  end
  for i = 1, #moved, 1000 do
    redis.call('RPUSH', KEYS[2], unpack(moved, i, math.min(i + 999, #moved)))
  end
  redis.call('SADD', KEYS[3], KEYS[2])
  for batch_id in pairs(batches) do redis.call('HSET', ARGV[4] .. batch_id, 'queue', ARGV[2]) end
end
return #moved
""")

# KEYS: queue list, the batch's cancel-pending list; ARGV: job id prefix of the batch. Takes the batch's jobs
# off the queue (the rest keep their order) onto the pending list, atomically; returns how many.
TAKE_OFF_QUEUE = Lua("""
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
local keep, taken = {}, {}
for _, id in ipairs(ids) do
  if string.sub(id, 1, #ARGV[1]) == ARGV[1] then taken[#taken + 1] = id else keep[#keep + 1] = id end
end
if #taken > 0 then
  redis.call('DEL', KEYS[1])
  for i = 1, #keep, 1000 do  -- unpack() is limited by Lua's C stack
    redis.call('RPUSH', KEYS[1], unpack(keep, i, math.min(i + 999, #keep)))
  end
  for i = 1, #taken, 1000 do
    redis.call('RPUSH', KEYS[2], unpack(taken, i, math.min(i + 999, #taken)))
  end
end
return #taken
""")

# KEYS: cancel-pending list, canceled registry, batch hash, counted set; ARGV: how many, registry score, job key
# prefix. Marks up to ARGV[1] pending jobs canceled and counts each of their requests once; returns how many it took.
CANCEL_PENDING = Lua("""
local ids = redis.call('LPOP', KEYS[1], ARGV[1])
if not ids then return 0 end
local counted = 0
local stored = redis.call('HGET', KEYS[3], 'counted_stored')  -- (counted.py) every request is counted
for _, id in ipairs(ids) do
  local job = ARGV[3] .. id
  if redis.call('HGET', job, 'status') == 'queued' then
    redis.call('HSET', job, 'status', 'canceled')
    redis.call('ZADD', KEYS[2], ARGV[2], id)
    local meta = cjson.decode(redis.call('HGET', job, 'meta'))
    if stored then
    elseif meta['custom_ids'] then  -- a group job: each of its requests
      for _, custom_id in ipairs(meta['custom_ids']) do counted = counted + redis.call('SADD', KEYS[4], custom_id) end
    else
      counted = counted + redis.call('SADD', KEYS[4], meta['custom_id'])
    end
  end
end
redis.call('HINCRBY', KEYS[3], 'cancelled', counted)
return #ids
""")

# The loop both job writers share: ARGV from @A on is n shared fields, then n (name, value) pairs, then per job: job id,
# custom id, data, meta, description; the job hash keys are KEYS[@K] on. KEYS[1..3]: queue list, rq:queues set, the
# batch's jobs hash (custom id -> job id; a fed batch's stored chunks list its requests instead: @INDEX is dropped).
_WRITE_JOBS_LOOP = """
local n = tonumber(ARGV[@A])
local shared = {}
for i = @A + 1, @A + 2 * n do shared[#shared + 1] = ARGV[i] end
local p = @A + 1 + 2 * n
local ids = {}
for k = @K, #KEYS do
  redis.call('HSET', KEYS[k], 'data', ARGV[p + 2], 'meta', ARGV[p + 3], 'description', ARGV[p + 4], unpack(shared))
  @INDEX
  ids[#ids + 1] = ARGV[p]
  p = p + 5
end
redis.call('SADD', KEYS[2], KEYS[1])
for i = 1, #ids, 1000 do  -- unpack() is limited by Lua's C stack
  redis.call('RPUSH', KEYS[1], unpack(ids, i, math.min(i + 999, #ids)))
end
"""

# KEYS: queue list, rq:queues set, batch jobs hash, then one job hash key per job; ARGV: the loop's -> jobs written.
_INDEX = "redis.call('HSET', KEYS[3], ARGV[p + 1], ARGV[p])"
WRITE_JOBS = Lua(_WRITE_JOBS_LOOP.replace("@A", "1").replace("@K", "4").replace("@INDEX", _INDEX) + "return #ids")

# KEYS: queue list, rq:queues set, batch jobs hash, batch hash, then one job hash key per job; ARGV: the chunk's index,
# how many requests its jobs hold, then the loop's. Writes the (group) jobs of a stored chunk (not in the jobs hash: the
# chunk lists them) only if it is the batch's next one (`fed`), the feeding was not closed and the batch runs
# (validating or in_progress), and moves `fed` on in the same step, so two feeders never write one chunk twice and a
# cancel never races a feed. Returns the requests written, or -1.
FEED_JOBS = Lua(
    """
local b = redis.call('HMGET', KEYS[4], 'fed', 'feed_closed', 'status')
if tonumber(b[1] or '0') ~= tonumber(ARGV[1]) or b[2] == '1' then return -1 end
if b[3] ~= 'in_progress' and b[3] ~= 'validating' then return -1 end
"""
    + _WRITE_JOBS_LOOP.replace("@A", "3").replace("@K", "5").replace("@INDEX", "")
    + """
redis.call('HINCRBY', KEYS[4], 'fed', 1)
redis.call('HINCRBY', KEYS[4], 'fed_requests', ARGV[2])
return tonumber(ARGV[2])
"""
)

# KEYS: batch hash, the feeding set; ARGV: batch id. A cancel or expiry stops the feeding: the stored requests not yet
# fed are counted cancelled at once (COUNT settles the batch once the fed ones are accounted for too). Returns how
# many; 0 if it was closed before.
CLOSE_FEED = Lua("""
local b = redis.call('HMGET', KEYS[1], 'feed_closed', 'spooled', 'fed_requests')
redis.call('ZREM', KEYS[2], ARGV[1])
if b[1] == '1' then return 0 end
local unfed = tonumber(b[2] or '0') - tonumber(b[3] or '0')
redis.call('HSET', KEYS[1], 'feed_closed', 1, 'unfed_cancelled', unfed)
if unfed > 0 then redis.call('HINCRBY', KEYS[1], 'cancelled', unfed) end
return unfed
""")

# KEYS: batch hash, the feeding set; ARGV: batch id, its score there. A resume feeds again what a cancel or expiry
# left unfed: those requests are no longer counted cancelled. Returns how many were taken back.
REOPEN_FEED = Lua("""
local b = redis.call('HMGET', KEYS[1], 'feed_closed', 'unfed_cancelled', 'fed', 'chunks')
local back = 0
if b[1] == '1' then
  back = tonumber(b[2] or '0')
  if back > 0 then redis.call('HINCRBY', KEYS[1], 'cancelled', 0 - back) end
  redis.call('HSET', KEYS[1], 'feed_closed', 0, 'unfed_cancelled', 0)
end
if tonumber(b[3] or '0') < tonumber(b[4] or '0') then redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1]) end
return back
""")
# ARGV: RQ's job key prefix, its result key prefix, its finished and canceled registry key prefixes, then job ids.
# Deletes (UNLINK: freed off the main thread) the job hash and result stream of each job that is finished or
# canceled, and takes it out of its queue's finished and canceled registries (the queue is the job's origin).
# Failed jobs stay (`miro retry` queues them again), and so does a job queued or started again (a resume, a retry,
# or RQ's clean-up of a dead worker's job). Returns how many it deleted; a job already gone counts 0, so running it
# again over the same ids is harmless.
RELEASE_JOBS = Lua("""
local released = 0
for i = 5, #ARGV do
  local id = ARGV[i]
  local job = ARGV[1] .. id
  local s = redis.call('HMGET', job, 'status', 'origin')
  if s[1] == 'finished' or s[1] == 'canceled' then
    if s[2] then
      redis.call('ZREM', ARGV[3] .. s[2], id)
      redis.call('ZREM', ARGV[4] .. s[2], id)
    end
    redis.call('UNLINK', job, ARGV[2] .. id)
    released = released + 1
  end
end
return released
""")

# KEYS: the batch releases; ARGV: batch id, the score it had when its release began. Takes it out only if it has not
# ended again since (a retry that ended anew is released again).
# KEYS: the batch hash, then its other keys; ARGV: seconds, the ended statuses... Gives every key a TTL if the batch
# has ended (one resumed meanwhile keeps its keys: submit.py makes them persist again). Returns 1 if it did.
EXPIRE_ENDED = Lua("""
local status = redis.call('HGET', KEYS[1], 'status')
for i = 2, #ARGV do
  if status == ARGV[i] then
    for k = 1, #KEYS do redis.call('EXPIRE', KEYS[k], ARGV[1]) end
    return 1
  end
end
return 0
""")

FORGET_RELEASE = Lua("""
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) == tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
""")

# KEYS: batch hash, its counted set; ARGV: the set's size when it was written to storage, the ended statuses...
# (counted.py) Deletes the set and marks the batch counted_stored, only if the batch has still ended, is not pinned or
# stored already, and the set still has that size. Returns 1 if it did.
STORE_COUNTED = Lua("""
local b = redis.call('HMGET', KEYS[1], 'status', 'counted_pinned', 'counted_stored')
if b[2] or b[3] then return 0 end
local ended = false
for i = 2, #ARGV do if b[1] == ARGV[i] then ended = true end end
if not ended or redis.call('SCARD', KEYS[2]) ~= tonumber(ARGV[1]) then return 0 end
redis.call('UNLINK', KEYS[2])
redis.call('HSET', KEYS[1], 'counted_stored', 1)
return 1
""")

# KEYS: batch hash. (counted.py) Pins the batch's counted set in Redis (a release no longer moves it to storage);
# returns 1 if it is in storage now (the caller reads it back), 0 if not.
PIN_COUNTED = Lua("""
redis.call('HSET', KEYS[1], 'counted_pinned', 1)
if redis.call('HGET', KEYS[1], 'counted_stored') then return 1 end
return 0
""")
