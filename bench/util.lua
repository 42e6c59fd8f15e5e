-- bench/util.lua: what the benchmark scripts share (require "bench.util").
local util = {}

function util.median (xs)
  local s = {table.unpack(xs)}
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

return util
