-- ARGV: prefix, keep_day_s, keep_month_s -> how many expired leases it released (100 at most).
return sweep(ARGV[1], now_ms(), tonumber(ARGV[2]), tonumber(ARGV[3]))
