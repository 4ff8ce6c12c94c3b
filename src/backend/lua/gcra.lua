-- GCRA (governor / redis-cell semantics). KEYS[1]: the theoretical arrival time (us).
-- ARGV: now_us|'', interval_us, burst, cost[, block_us]
local now = now_us()
local t, burst, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if cost > burst then return {2, burst, 0, 0, 0} end
local left = lock_left(now)
if left then return {1, burst, 0, left, left} end
local tau = burst * t
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
local allow_at = tat + math.max(cost, 1) * t - tau
if allow_at > now then
  return deny(now, cost, {1, burst, math.floor(math.max(now + tau - tat, 0) / t), tat - now, allow_at - now})
end
if cost == 0 then return {0, burst, math.floor((now + tau - tat) / t), tat - now, 0} end
local new_tat = tat + cost * t
redis.call('SET', KEYS[1], int(new_tat), 'PX', int(math.ceil((new_tat - now) / 1000) + 1))
return {0, burst, math.floor((now + tau - new_tat) / t), new_tat - now, 0}
