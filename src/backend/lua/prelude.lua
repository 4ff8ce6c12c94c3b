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
