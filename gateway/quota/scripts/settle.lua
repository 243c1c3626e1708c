-- ARGV: prefix, rid, prompt, completion, keep_day_s, keep_month_s, day, month, scopes...
-- Returns 1; 0 when the lease had run out (the usage is charged to the periods anyway);
-- 2 when it was already settled (a repeat: nothing changes).
local p, rid = ARGV[1], ARGV[2]
local prompt, completion = tonumber(ARGV[3]), tonumber(ARGV[4])
local keep_day, keep_month = tonumber(ARGV[5]), tonumber(ARGV[6])
if finish(p, rid, prompt, completion, keep_day, keep_month, 'settled') == 1 then return 1 end
local done = p .. 'done:' .. rid
if redis.call('GET', done) == 'settled' then return 2 end
redis.call('SET', done, 'settled', 'EX', 86400)
redis.call('HINCRBY', p .. 'stats', 'late', 1)
if prompt + completion > 0 then
  for i = 9, #ARGV do
    charge(p .. 'd:' .. ARGV[i] .. ':' .. ARGV[7], prompt, completion, keep_day)
    charge(p .. 'm:' .. ARGV[i] .. ':' .. ARGV[8], prompt, completion, keep_month)
  end
end
return 0
