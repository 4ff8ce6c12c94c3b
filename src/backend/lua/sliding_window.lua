-- Sliding-window counter. KEYS[1]: hash {w = current window index, p = previous count,
-- c = current count}. Admit iff p*(W-e) + (c+cost)*W <= limit*W (e = time into the window).
-- ARGV: now_us|'', window_us, limit, cost[, block_us]
local now = now_us()
local w, limit, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if cost > limit then return {2, limit, 0, 0, 0} end
local left = lock_left(now)
if left then return {1, limit, 0, left, left} end
local index = math.floor(now / w)
local stored = redis.call('HMGET', KEYS[1], 'w', 'p', 'c')
local sw, prev, cur = tonumber(stored[1]), tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
if sw == nil then
  prev, cur = 0, 0
elseif sw == index - 1 then
  prev, cur = cur, 0
elseif sw < index - 1 then
  prev, cur = 0, 0
elseif sw > index then
  index = sw -- a stored window ahead of this clock: count in it (conservative)
end
local elapsed = math.min(math.max(now - index * w, 0), w)
local used = prev * (w - elapsed) + cur * w
local budget = limit * w
local reset = 0
if cur > 0 then reset = 2 * w - elapsed elseif prev > 0 then reset = w - elapsed end
local probe = math.max(cost, 1)
if used + probe * w > budget then
  local function fits_at(p, room)
    if p == 0 then return 0 end
    return w - math.min(math.floor(room * w / p), w)
  end
  local retry
  if cur + probe <= limit then
    retry = math.max(fits_at(prev, limit - cur - probe) - elapsed, 0)
  else
    retry = w - elapsed + fits_at(cur, limit - probe)
  end
  return deny(now, cost, {1, limit, math.floor(math.max(budget - used, 0) / w), reset, math.max(retry, 1)})
end
if cost == 0 then return {0, limit, math.floor((budget - used) / w), reset, 0} end
redis.call('HSET', KEYS[1], 'w', int(index), 'p', int(prev), 'c', int(cur + cost))
redis.call('PEXPIRE', KEYS[1], int(math.ceil((2 * w - elapsed) / 1000) + 1))
return {0, limit, math.floor((budget - used) / w) - cost, 2 * w - elapsed, 0}
