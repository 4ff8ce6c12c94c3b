-- Shared by every script. Time is Redis's own clock (TIME), in microseconds, unless a test
-- passes an explicit instant as ARGV[1]. Integers travel as strings formatted with %.0f:
-- Lua numbers are doubles, exact below 2^53 (285 years of microseconds).
local function now_us()
  if ARGV[1] ~= nil and ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function int(x)
  return string.format('%.0f', x)
end
-- Reply: {verdict (0 allowed, 1 denied, 2 can never fit), limit, remaining,
--         reset_after_us, retry_after_us}
-- A cost of 0 is a peek, as in the local engine: allowed when a request of one token would
-- be (remaining: the tokens there now), else that request's denial; nothing is written.
-- A lockout (`block_for`): ARGV[5] microseconds ('' or 0: none), kept under the last of
-- KEYS as the instant it ends. A locked key is denied, uncounted, until then; a denial that
-- charges nothing (not a peek) locks the key.
local function block_us()
  return tonumber(ARGV[5] or '') or 0
end
local function lock_left(now)
  if block_us() <= 0 then return nil end
  local ends = tonumber(redis.call('GET', KEYS[#KEYS]) or '0')
  if ends > now then return ends - now end
  return nil
end
local function deny(now, cost, reply)
  local block = block_us()
  if block > 0 and cost > 0 then
    redis.call('SET', KEYS[#KEYS], int(now + block), 'PX', int(math.ceil(block / 1000) + 1))
    reply[4] = math.max(reply[4], block)
    reply[5] = math.max(reply[5], block)
  end
  return reply
end
