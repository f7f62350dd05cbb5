"""The sink's two Lua scripts: the commit (:data:`COMMIT`) and the abort (:data:`ABORT`).

A script runs alone in the server: nothing else runs, and no reader sees its effects, until it
returns; the AOF logs its writes as one ``MULTI ... EXEC`` block, which a restart replays
whole or not at all. Redis never rolls a failed script back, so each runs every check before
its first write: an error reply means nothing was written.

**COMMIT** ``KEYS = stream, proofs, staged, moved, stage...``, ``ARGV = budget, (txn id,
chunks)...``: first, for each transaction, its proof (then ``already``) or its staging stream
holding exactly the chunks its handle names, less those moved (else :data:`STAGING_INCOMPLETE`
and no write); then, in order, each chunk's rows are added to the stream (``XADD *``) until
``budget`` rows have moved; a transaction whose chunks all moved gets its proof (the server's
clock), and its staging, index and progress entries go; one cut short keeps its progress
(the moved chunks trimmed off its staging: ``pending``). Answers one word per transaction.
A batch of at most ``budget`` rows is therefore visible at once; a larger one chunk by chunk,
in order, each script's part at once.

**ABORT** ``KEYS = proofs, staged, moved, stage``, ``ARGV = txn id``: ``committed`` (its proof
stands; the index entry of a reused id goes), :data:`COMMIT_IN_PROGRESS` refused (a decided
transaction part moved), else its staging and index entry deleted: ``aborted`` or ``absent``.
"""

from __future__ import annotations

from sinks.redis.errors import COMMIT_IN_PROGRESS, STAGING_INCOMPLETE

#: Answers of the scripts, per transaction.
ALREADY, COMMITTED, PENDING = b"already", b"committed", b"pending"
ABORTED, ABSENT = b"aborted", b"absent"

COMMIT = """
local stream, proofs, staged, moved = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local budget = tonumber(ARGV[1])
local count = #KEYS - 4
local state = {}
for i = 1, count do
  local txn, expected = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  if redis.call('HEXISTS', proofs, txn) == 1 then
    state[i] = 'already'
  else
    local done = tonumber(redis.call('HGET', moved, txn) or '0')
    local left = redis.call('XLEN', KEYS[4 + i])
    if left ~= expected - done then
      return redis.error_reply('{incomplete} ' .. txn .. ': its staging holds ' .. left ..
        ' chunks where its handle names ' .. (expected - done))
    end
    state[i] = done
  end
end

local function add_rows(value)
  local chunk = cmsgpack.unpack(value)
  local rows, names = chunk[1], chunk[2]
  for row = 1, rows do
    local fields = {}
    for column = 1, #names do
      local text = chunk[2 + column][row]
      if text ~= nil then
        fields[#fields + 1] = names[column]
        fields[#fields + 1] = text
      end
    end
    if #fields == 0 then fields = {names[1], ''} end
    redis.call('XADD', stream, '*', unpack(fields))
  end
  return rows
end

local clock = redis.call('TIME')
local now = clock[1] .. string.format('%06d', tonumber(clock[2]))
local answers = {}
for i = 1, count do
  local txn, stage, done = ARGV[2 * i], KEYS[4 + i], state[i]
  if done == 'already' then
    answers[i] = 'already'
  elseif budget <= 0 then
    answers[i] = 'pending'
  else
    local after, next_id = '-', nil
    while true do
      local entries = redis.call('XRANGE', stage, after, '+', 'COUNT', 1)
      if #entries == 0 then break end
      if budget <= 0 then next_id = entries[1][1]; break end
      budget = budget - add_rows(entries[1][2][2])
      done = done + 1
      after = '(' .. entries[1][1]
    end
    if next_id == nil then
      redis.call('HSET', proofs, txn, now)
      redis.call('DEL', stage)
      redis.call('HDEL', moved, txn)
      redis.call('HDEL', staged, txn)
      answers[i] = 'committed'
    else
      redis.call('XTRIM', stage, 'MINID', next_id)
      redis.call('HSET', moved, txn, done)
      answers[i] = 'pending'
    end
  end
end
return answers
""".replace("{incomplete}", STAGING_INCOMPLETE)

ABORT = """
local proofs, staged, moved, stage, txn = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
if redis.call('HEXISTS', proofs, txn) == 1 then
  redis.call('HDEL', staged, txn)
  return 'committed'
end
if redis.call('HEXISTS', moved, txn) == 1 then
  return redis.error_reply('{in_progress} ' .. txn .. ': its commit has begun')
end
if redis.call('DEL', stage) + redis.call('HDEL', staged, txn) > 0 then return 'aborted' end
return 'absent'
""".replace("{in_progress}", COMMIT_IN_PROGRESS)
