-- I: hang: totable of a 0-element tensor with 2^40 rows makes 2^40 empty tables
-- (the "more elements than a Lua table can hold" check counts elements, 0 here).
local _ = mg.zeros{1 << 40, 0}:totable()
