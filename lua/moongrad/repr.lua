--- moongrad.repr: values as the REPL shows them.
--
--   mg.repr(v [, {width = 80, depth = 4, items = 20}]) -> string
--
-- A plain table (one with no __tostring) reads as a Lua constructor: the
-- array part in order, then the other keys sorted (names bare, other keys
-- in brackets), `{2, 3}`, `{current_bytes = 1.0 MiB, live_tensors = 3}`.
-- On one line when it fits `width`, else one entry a line, indented; nested
-- tables down to `depth` (deeper ones as `{...}`); a table met again inside
-- itself as `<cycle>`; at most `items` entries each, then `... (N more)`.
-- Counts of bytes (integer fields named *_bytes, and cache_limit) show with
-- units, as `1.5 MiB`. Tensors and variables inside a table show as
-- `<tensor (2,3) float32>` and `<variable 'w' (2) float32>`; any other
-- value with a __tostring, and a value at the top, as tostring shows it (a
-- tensor with its entries, a layer as its summary).
-- @module moongrad.repr
local mg = require "moongrad"
local fail = require("moongrad.check").fail

local DEFAULTS = {width = 80, depth = 4, items = 20}

local function is_byte_count (k, v)
  return math.type(v) == "integer" and type(k) == "string" and (k:match("_bytes$") or k == "cache_limit")
end

local function bytes (n)
  local units, v, u = {"KiB", "MiB", "GiB", "TiB"}, n, 0
  if n < 1024 then return ("%d B"):format(n) end
  while v >= 1024 and u < #units do v, u = v / 1024, u + 1 end
  return ("%.1f %s"):format(v, units[u])
end

local function key_text (k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return k end
  if type(k) == "string" then return ("[%q]"):format(k) end
  return "[" .. tostring(k) .. "]"
end

-- number before string before anything else; then by value or by text
local KEY_RANK = {number = 1, string = 2}
local function key_less (a, b)
  local ra, rb = KEY_RANK[type(a)] or 3, KEY_RANK[type(b)] or 3
  if ra ~= rb then return ra < rb end
  if ra < 3 then return a < b end
  return tostring(a) < tostring(b)
end

local function has_tostring (v)
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__tostring ~= nil
end

local show

local function show_table (t, opts, level, seen, indent)
  if seen[t] then return "<cycle>" end
  if level >= opts.depth then return next(t) == nil and "{}" or "{...}" end
  seen[t] = true
  local n, parts = #t, {}
  for i = 1, n do parts[#parts + 1] = show(t[i], opts, level + 1, seen, indent .. "  ") end
  local keys = {}
  for k in pairs(t) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_less)
  for _, k in ipairs(keys) do
    local v = t[k]
    local text = is_byte_count(k, v) and bytes(v) or show(v, opts, level + 1, seen, indent .. "  ")
    parts[#parts + 1] = key_text(k) .. " = " .. text
  end
  seen[t] = nil
  local total = #parts
  if total > opts.items then
    for i = total, opts.items + 1, -1 do parts[i] = nil end
    parts[#parts + 1] = ("... (%d more)"):format(total - opts.items)
  end
  local line = "{" .. table.concat(parts, ", ") .. "}"
  if #line + #indent <= opts.width and not line:find("\n", 1, true) then return line end
  return "{\n" .. indent .. "  " .. table.concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end

function show (v, opts, level, seen, indent)
  local tv = type(v)
  if tv == "string" then return level == 0 and v or ("%q"):format(v) end
  if level > 0 and mg.is_variable(v) then
    return ("<variable '%s' (%s) %s>"):format(v.name, table.concat(v.shape, ","), v.dtype)
  elseif level > 0 and mg.is_tensor(v) then
    return ("<tensor (%s) %s>"):format(table.concat(v.shape, ","), v.dtype)
  end
  if tv == "table" and not has_tostring(v) then return show_table(v, opts, level, seen, indent) end
  return tostring(v)
end

local OPTIONS = {width = true, depth = true, items = true}

return function(v, opts)
  local o = {}
  for k, d in pairs(DEFAULTS) do o[k] = d end
  if opts ~= nil then
    if type(opts) ~= "table" then fail("repr", "options must be a table, got %s", type(opts)) end
    for k, x in pairs(opts) do
      if not OPTIONS[k] then fail("repr", "unknown option '%s' (known: depth, items, width)", tostring(k)) end
      if math.type(x) ~= "integer" or x < 1 then
        fail("repr", "option '%s' must be a positive integer, got %s", k, tostring(x))
      end
      o[k] = x
    end
  end
  return show(v, o, 0, {}, "")
end
