-- ARGV: prefix, lease_ms, rids... -> the rids whose lease is gone.
local p, lease = ARGV[1], tonumber(ARGV[2])
local until_ms = now_ms() + lease
local missing = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', p .. 'leases', ARGV[i]) then
    redis.call('ZADD', p .. 'leases', until_ms, ARGV[i])
  else
    table.insert(missing, ARGV[i])
  end
end
return missing
