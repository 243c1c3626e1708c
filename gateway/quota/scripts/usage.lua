-- ARGV: prefix, scope, window_ms -> {day, month, live, window requests, window tokens,
--   day prompt, completion, requests, reserved, month prompt, completion, requests, reserved}
local p, s, window = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local day = fdiv(now, 86400000)
local y, m = civil(day)
local month = y * 12 + m - 1
local w, wt = p .. 'w:' .. s, p .. 'wt:' .. s
local rids = redis.call('ZRANGEBYSCORE', w, '(' .. (now - window), '+inf')
local tokens = 0
for _, rid in ipairs(rids) do tokens = tokens + num(redis.call('HGET', wt, rid)) end
local out = {day, month, redis.call('SCARD', p .. 'live:' .. s), #rids, tokens}
for _, k in ipairs({p .. 'd:' .. s .. ':' .. day, p .. 'm:' .. s .. ':' .. month}) do
  local c = redis.call('HMGET', k, 'prompt', 'completion', 'requests', 'reserved')
  for j = 1, 4 do table.insert(out, num(c[j])) end
end
return out
