-- Give back `cost` tokens that a decision of the same policy took for KEYS[1] at most
-- `within` us ago (another policy denied the request, or its response did not count).
-- ARGV: now_us|'', interval or window (us), capacity, cost, within_us, algorithm
-- Reply: 1 given back, 0 nothing to give back (the charge's window is over, or it cannot be
-- told apart from the window next to it: the charge then stays counted, never more).
local now = now_us()
local unit, cost, within = tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local algorithm = ARGV[6]
if cost <= 0 then return 0 end
if algorithm == 'token_bucket' or algorithm == 'gcra' then
  -- The instant the bucket is full again (GCRA: its theoretical arrival time) moves back by
  -- the tokens' refill time; one that reaches now is a full bucket.
  local at = tonumber(redis.call('GET', KEYS[1]) or '0')
  if at <= now then return 0 end
  local back = at - cost * unit
  if back <= now then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], int(back), 'PX', int(math.ceil((back - now) / 1000) + 1))
  end
  return 1
end
if algorithm == 'sliding_log' then
  -- A log has no windows to cross: its entries leave one by one. The earliest entry of
  -- this cost made in [now - within - 1 s, now] and still in the log (made less than a
  -- window ago) goes: the call's own, or an older one that would have left sooner (the
  -- one left counts until later: never less). The second of slack covers a refund that
  -- waited behind other commands longer than `within` allows for.
  local from = math.max(now - within - 1000000, now - unit + 1)
  local entries = redis.call('ZRANGEBYSCORE', KEYS[1], int(from), int(now))
  for i = 1, #entries do
    local c = tonumber(string.match(entries[i], ':(%d+)$'))
    if c == cost then
      redis.call('ZREM', KEYS[1], entries[i])
      return 1
    end
  end
  return 0
end
-- Windows: the charge was made in the window of every instant of [now - within, now], or
-- it is not given back.
local index = math.floor(now / unit)
if math.floor((now - within) / unit) ~= index then return 0 end
if algorithm == 'fixed_window' or algorithm == 'sliding_window' then
  -- The count of the current window (a sliding window's earlier one weighs as it was).
  local stored = redis.call('HMGET', KEYS[1], 'w', 'c')
  if tonumber(stored[1]) ~= index then return 0 end
  local count = tonumber(stored[2]) or 0
  redis.call('HSET', KEYS[1], 'c', int(math.max(count - cost, 0)))
  return 1
end
return 0
