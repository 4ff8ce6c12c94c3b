-- Fixed window aligned to the epoch. KEYS[1]: hash {w = window index, c = count}.
-- ARGV: now_us|'', window_us, limit, cost[, block_us]
local now = now_us()
local window, limit, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if cost > limit then return {2, limit, 0, 0, 0} end
local left = lock_left(now)
if left then return {1, limit, 0, left, left} end
local index = math.floor(now / window)
local reset = (index + 1) * window - now
local stored = redis.call('HMGET', KEYS[1], 'w', 'c')
local count = 0
if tonumber(stored[1]) == index then count = tonumber(stored[2]) or 0 end
if count + math.max(cost, 1) > limit then
  return deny(now, cost, {1, limit, limit - count, reset, reset})
end
if cost == 0 then return {0, limit, limit - count, reset, 0} end
redis.call('HSET', KEYS[1], 'w', int(index), 'c', int(count + cost))
redis.call('PEXPIRE', KEYS[1], int(math.ceil(reset / 1000) + 1))
return {0, limit, limit - count - cost, reset, 0}
