-- ARGV: prefix, rid, cost, window_ms, lease_ms, keep_day_s, keep_month_s, n,
--       then n x (scope, rpm, tpm, daily, monthly, concurrency), -1 for unlimited.
-- Returns {1, day, month, now} or {0, scope index (1-based), reason, retry ms, limit, current}.
-- Mirrors policies/quotas.check: keep the two in step.
local p, rid = ARGV[1], ARGV[2]
local cost, window, lease = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local keep_day, keep_month, n = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local held = redis.call('HMGET', p .. 'r:' .. rid, 'day', 'month', 'at')
if held[1] then return {1, tonumber(held[1]), tonumber(held[2]), tonumber(held[3])} end  -- a retry
local now = now_ms()
sweep(p, now, keep_day, keep_month)
local day = fdiv(now, 86400000)
local y, m = civil(day)
local month = y * 12 + m - 1
local day_end = (day + 1) * 86400000
local ny, nm = y, m + 1
if nm == 13 then ny, nm = y + 1, 1 end
local month_end = days_from_civil(ny, nm) * 86400000
local scopes = {}
for i = 1, n do
  local b = 8 + (i - 1) * 6
  local s = ARGV[b + 1]
  local rpm, tpm = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local daily, monthly, conc = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
  scopes[i] = s
  local w, wt, ws = p .. 'w:' .. s, p .. 'wt:' .. s, p .. 'ws:' .. s
  local old = redis.call('ZRANGEBYSCORE', w, '-inf', now - window)
  for _, o in ipairs(old) do
    redis.call('INCRBY', ws, -num(redis.call('HGET', wt, o)))
    redis.call('HDEL', wt, o)
  end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', w, '-inf', now - window) end
  if redis.call('EXISTS', w) == 0 then redis.call('DEL', ws) end
  local live = redis.call('SCARD', p .. 'live:' .. s)
  if conc >= 0 and live + 1 > conc then return {0, i, 'concurrency', 1000, conc, live} end
  local count = redis.call('ZCARD', w)
  if rpm >= 0 and count + 1 > rpm then
    local e = redis.call('ZRANGE', w, count - rpm, count - rpm, 'WITHSCORES')
    return {0, i, 'rpm', math.max(1, tonumber(e[2]) + window - now), rpm, count}
  end
  if tpm >= 0 then
    local held = num(redis.call('GET', ws))
    if cost > tpm then return {0, i, 'tpm_too_large', 0, tpm, cost} end
    if held + cost > tpm then
      local excess, freed, retry = held + cost - tpm, 0, window
      local es = redis.call('ZRANGE', w, 0, -1, 'WITHSCORES')
      for j = 1, #es, 2 do
        freed = freed + num(redis.call('HGET', wt, es[j]))
        if freed >= excess then retry = math.max(1, tonumber(es[j + 1]) + window - now); break end
      end
      return {0, i, 'tpm', retry, tpm, held}
    end
  end
  local budgets = {
    {daily, p .. 'd:' .. s .. ':' .. day, 'daily', day_end},
    {monthly, p .. 'm:' .. s .. ':' .. month, 'monthly', month_end},
  }
  for _, bg in ipairs(budgets) do
    if bg[1] >= 0 then
      local c = redis.call('HMGET', bg[2], 'prompt', 'completion', 'reserved')
      local used, reserved = num(c[1]) + num(c[2]), num(c[3])
      if used + cost > bg[1] then return {0, i, bg[3], math.max(1, bg[4] - now), bg[1], used + reserved} end
      if used + reserved + cost > bg[1] then return {0, i, bg[3] .. '_in_flight', 1000, bg[1], used + reserved} end
    end
  end
end
for _, s in ipairs(scopes) do
  local w, wt, ws = p .. 'w:' .. s, p .. 'wt:' .. s, p .. 'ws:' .. s
  redis.call('ZADD', w, now, rid)
  redis.call('HSET', wt, rid, cost)
  redis.call('INCRBY', ws, cost)
  -- The three expire together, once every entry is older than the window.
  redis.call('PEXPIRE', w, window)
  redis.call('PEXPIRE', wt, window)
  redis.call('PEXPIRE', ws, window)
  local dk, mk = p .. 'd:' .. s .. ':' .. day, p .. 'm:' .. s .. ':' .. month
  redis.call('HINCRBY', dk, 'reserved', cost)
  redis.call('EXPIRE', dk, keep_day)
  redis.call('HINCRBY', mk, 'reserved', cost)
  redis.call('EXPIRE', mk, keep_month)
  redis.call('SADD', p .. 'live:' .. s, rid)
end
redis.call('HSET', p .. 'r:' .. rid, 'scopes', table.concat(scopes, '\n'), 'cost', cost, 'day', day, 'month', month,
  'at', now)
redis.call('ZADD', p .. 'leases', now + lease, rid)
return {1, day, month, now}
