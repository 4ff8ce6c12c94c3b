-- Token bucket. KEYS[1]: the instant (us) the bucket is full again.
-- ARGV: now_us|'', interval_us, capacity, cost[, block_us]
local now = now_us()
local interval, capacity, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if cost > capacity then return {2, capacity, 0, 0, 0} end
local left = lock_left(now)
if left then return {1, capacity, 0, left, left} end
local depth = capacity * interval
local full_at = tonumber(redis.call('GET', KEYS[1]) or '0')
local deficit = math.min(math.max(full_at - now, 0), depth)
local level = depth - deficit
local need = math.max(cost, 1) * interval
if need > level then
  return deny(now, cost, {1, capacity, math.floor(level / interval), deficit, need - level})
end
if cost == 0 then return {0, capacity, math.floor(level / interval), deficit, 0} end
local after = deficit + need
redis.call('SET', KEYS[1], int(now + after), 'PX', int(math.ceil(after / 1000) + 1))
return {0, capacity, math.floor((depth - after) / interval), after, 0}
