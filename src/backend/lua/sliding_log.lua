-- Sliding log, exact. KEYS[1]: sorted set of admitted requests, member "time:seq:cost",
-- score time; KEYS[2]: a sequence counter, so that requests in the same microsecond stay
-- distinct members. An entry at t counts while now < t + W.
-- ARGV: now_us|'', window_us, limit, cost[, block_us]
local now = now_us()
local window, limit, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if cost > limit then return {2, limit, 0, 0, 0} end
local left = lock_left(now)
if left then return {1, limit, 0, left, left} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now - window))
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local total, last = 0, nil
local costs, times = {}, {}
for i = 1, #entries, 2 do
  local c = tonumber(string.match(entries[i], ':(%d+)$'))
  local t = tonumber(entries[i + 1])
  total = total + c
  costs[#costs + 1], times[#times + 1] = c, t
  last = t
end
local reset = 0
if last ~= nil then reset = math.max(last + window - now, 0) end
local probe = math.max(cost, 1)
if total + probe > limit then
  local freed, retry = 0, window
  for i = 1, #costs do
    freed = freed + costs[i]
    if total - freed + probe <= limit then
      retry = math.max(times[i] + window - now, 1)
      break
    end
  end
  return deny(now, cost, {1, limit, limit - total, reset, retry})
end
if cost == 0 then return {0, limit, limit - total, reset, 0} end
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], int(now), int(now) .. ':' .. seq .. ':' .. int(cost))
redis.call('PEXPIRE', KEYS[1], int(math.ceil(window / 1000) + 1))
redis.call('PEXPIRE', KEYS[2], int(math.ceil(window / 1000) + 1))
return {0, limit, limit - total - cost, window, 0}
