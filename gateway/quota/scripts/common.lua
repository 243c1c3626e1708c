-- Shared by every script (prepended to each): the clock, the calendar, and finishing a
-- reservation.
-- KEYS[1], when a store is given a clock (tests), is the time in ms; else Redis's own clock.
local function now_ms()
  if KEYS[1] then return tonumber(KEYS[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fdiv(a, b) return math.floor(a / b) end
-- policies/quotas.py: civil_from_days / days_from_civil (Howard Hinnant)
local function civil(z)
  z = z + 719468
  local era = fdiv(z >= 0 and z or z - 146096, 146097)
  local doe = z - era * 146097
  local yoe = fdiv(doe - fdiv(doe, 1460) + fdiv(doe, 36524) - fdiv(doe, 146096), 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + fdiv(yoe, 4) - fdiv(yoe, 100))
  local mp = fdiv(5 * doy + 2, 153)
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return y, m
end
local function days_from_civil(y, m)
  if m <= 2 then y = y - 1 end
  local era = fdiv(y >= 0 and y or y - 399, 400)
  local yoe = y - era * 400
  local doy = fdiv(153 * (m > 2 and m - 3 or m + 9) + 2, 5)
  local doe = yoe * 365 + fdiv(yoe, 4) - fdiv(yoe, 100) + doy
  return era * 146097 + doe - 719468
end
local function num(v) return tonumber(v) or 0 end
local function charge(k, prompt, completion, keep)
  redis.call('HINCRBY', k, 'prompt', prompt)
  redis.call('HINCRBY', k, 'completion', completion)
  redis.call('HINCRBY', k, 'requests', 1)
  redis.call('EXPIRE', k, keep)
end
-- Settle (counted) or release (not counted) one reservation; 0 if it is gone. A tombstone
-- (done:{rid} = settled | expired) makes a repeated settle (a retry after a lost reply) a no-op.
local function finish(p, rid, prompt, completion, keep_day, keep_month, how)
  redis.call('ZREM', p .. 'leases', rid)
  local r = p .. 'r:' .. rid
  local rec = redis.call('HMGET', r, 'scopes', 'cost', 'day', 'month')
  if not rec[1] then return 0 end
  local cost = tonumber(rec[2])
  local counted = prompt + completion > 0
  for s in string.gmatch(rec[1], '[^\n]+') do
    local dk, mk = p .. 'd:' .. s .. ':' .. rec[3], p .. 'm:' .. s .. ':' .. rec[4]
    redis.call('HINCRBY', dk, 'reserved', -cost)
    redis.call('HINCRBY', mk, 'reserved', -cost)
    if counted then
      charge(dk, prompt, completion, keep_day)
      charge(mk, prompt, completion, keep_month)
    end
    local w, wt, ws = p .. 'w:' .. s, p .. 'wt:' .. s, p .. 'ws:' .. s
    if redis.call('ZSCORE', w, rid) then
      local was = num(redis.call('HGET', wt, rid))
      if counted then
        redis.call('HSET', wt, rid, prompt + completion)
        redis.call('INCRBY', ws, prompt + completion - was)
      else
        redis.call('ZREM', w, rid)
        redis.call('HDEL', wt, rid)
        redis.call('INCRBY', ws, -was)
      end
    end
    redis.call('SREM', p .. 'live:' .. s, rid)
  end
  redis.call('DEL', r)
  redis.call('SET', p .. 'done:' .. rid, how, 'EX', 86400)
  return 1
end
local function sweep(p, now, keep_day, keep_month)
  local expired = redis.call('ZRANGEBYSCORE', p .. 'leases', '-inf', now, 'LIMIT', 0, 100)
  for _, rid in ipairs(expired) do
    finish(p, rid, 0, 0, keep_day, keep_month, 'expired')
  end
  if #expired > 0 then redis.call('HINCRBY', p .. 'stats', 'expired', #expired) end
  return #expired
end
