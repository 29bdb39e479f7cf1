// The Lua scripts that make each state transition of a job atomic in Redis. A job is owned by the worker
// that claimed it last: claiming bumps the job's epoch, and every later write of the worker (events,
// result) is applied only while the hash still names that owner and epoch, so a worker whose job was
// reclaimed after its visibility timeout cannot publish a second result.
#pragma once
#include "serve/redis/redis_client.h"

namespace atelier::serve::redis::scripts {

// Gateway: accept a job. KEYS: job hash, jobs stream, models set. ARGV: id, request JSON, model,
// created_ms, capacity. Returns the stream entry id, or "" when the stream already holds `capacity` entries.
inline const RedisScript kSubmit{R"lua(
if redis.call('XLEN', KEYS[2]) >= tonumber(ARGV[5]) then return '' end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'state', 'queued', 'request', ARGV[2], 'model', ARGV[3],
           'created_ms', ARGV[4], 'epoch', '0', 'attempts', '0')
redis.call('SADD', KEYS[3], ARGV[3])
local entry = redis.call('XADD', KEYS[2], '*', 'id', ARGV[1])
redis.call('HSET', KEYS[1], 'entry', entry)
return entry
)lua"};

// Gateway: cancel or expire a job. KEYS: job hash, events stream, jobs stream. ARGV: final state
// (cancelled | failed), reason, ttl_s, event data JSON. A queued job ends at once (1); a running one gets
// the cancel flag its worker checks at every step (0, only for `cancelled`); -1 when already finished.
inline const RedisScript kCancel{R"lua(
local st = redis.call('HGET', KEYS[1], 'state')
if st == 'queued' then
  local entry = redis.call('HGET', KEYS[1], 'entry')
  if entry then redis.call('XDEL', KEYS[3], entry) end
  redis.call('HSET', KEYS[1], 'state', ARGV[1], 'error', ARGV[2])
  redis.call('XADD', KEYS[2], '*', 'type', ARGV[1], 'data', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  return 1
end
if st == 'running' then
  if ARGV[1] == 'cancelled' then redis.call('HSET', KEYS[1], 'cancel', ARGV[2]) end
  return 0
end
return -1
)lua"};

// Worker: claim a job read from the stream. KEYS: job hash. ARGV: consumer, entry id.
// Returns {'missing'} (no such job: the message is malformed), {'finished'} (already done: just ack), or
// {'claimed', epoch, request JSON, cancel reason}.
inline const RedisScript kClaim{R"lua(
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return {'missing'} end
if st == 'done' or st == 'failed' or st == 'cancelled' then return {'finished'} end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[1], 'entry', ARGV[2])
return {'claimed', tostring(epoch), redis.call('HGET', KEYS[1], 'request') or '',
        redis.call('HGET', KEYS[1], 'cancel') or ''}
)lua"};

// Worker: publish a progress event while holding the job. KEYS: job hash, events stream. ARGV: owner,
// epoch, type, data JSON, max events kept, then field/value pairs for the hash. 1 = written, 0 = lease lost.
inline const RedisScript kPublish{R"lua(
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2]
   or redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'type', ARGV[3], 'data', ARGV[4])
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
if ARGV[3] == 'started' then redis.call('HINCRBY', KEYS[1], 'attempts', 1) end
return 1
)lua"};

// Worker: the job's outcome. KEYS: job hash, events stream, jobs stream. ARGV: owner, epoch, state (done |
// failed | cancelled), event data JSON, ttl_s, consumer group, stream entry, then field/value pairs.
// 1 = written, 2 = it was already finished, 0 = another worker holds the job now (the entry is theirs and
// stays). On 1 and 2 the stream entry is acknowledged and deleted in the same step, so no reader ever sees
// a finished job whose entry is still queued.
inline const RedisScript kFinish{R"lua(
local st = redis.call('HGET', KEYS[1], 'state')
local finished = st == 'done' or st == 'failed' or st == 'cancelled'
if not finished then
  if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2] then return 0 end
  redis.call('HSET', KEYS[1], 'state', ARGV[3])
  for i = 8, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  redis.call('XADD', KEYS[2], '*', 'type', ARGV[3], 'data', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
end
redis.call('XACK', KEYS[3], ARGV[6], ARGV[7])
redis.call('XDEL', KEYS[3], ARGV[7])
if finished then return 2 end
return 1
)lua"};

}  // namespace atelier::serve::redis::scripts
