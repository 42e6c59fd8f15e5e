--- moongrad.class: the one way moongrad's Lua modules make a class.
--
--   local class = require "moongrad.class"
--   local Thing = class("moongrad.things.Thing" [, Parent])
--   function Thing.__new (a, b) return setmetatable({a = a, b = b}, Thing) end
--   function Thing:size () return self.a + self.b end
--   local t = Thing(1, 2)                      -- Thing.__new(1, 2)
--
-- A class is the metatable of its instances: Thing.__index = Thing, so its
-- fields are their methods; Thing.__name is its full name (tostring, error
-- messages); Thing.__parent the class it derives from, or nil. The class's
-- own metatable makes it callable, Thing(...) being its own __new(...), and
-- looks up in Parent a field the class lacks, so methods are inherited.
-- Lua reads metamethods (__call, __tostring, __newindex, ...) from an
-- instance's metatable itself, so the ones Parent has when the class is made
-- are copied into it. A class without a __new of its own is a base class:
-- calling it fails. nn's layers add properties by a __index function of
-- their own (moongrad.layer); everything else keeps this one. A public
-- method that moongrad's modules define (Thing.size = f, not Thing.__x or
-- Thing._x) is stored guarded (moongrad.check's guard): its errors name the
-- user's line.
-- @module moongrad.class
local check = require "moongrad.check"

-- the fields of a parent that are not copied: each class has its own
local own = {__index = true, __name = true, __parent = true, __new = true}

local function construct (cls, ...)
  local new = rawget(cls, "__new")
  if new == nil then error(("%s is a base class: it makes no instances"):format(cls.__name)) end
  return new(...)
end
construct = check.guard(construct)

-- a new field of a class: a method of these modules is stored guarded
local function define (cls, k, v)
  rawset(cls, k, check.public(k, v) and check.guard(v) or v)
end

return function (name, parent)
  local cls = {__name = name, __parent = parent}
  cls.__index = cls
  if parent then
    for k, v in pairs(parent) do
      if type(k) == "string" and k:find("^__") and not own[k] then cls[k] = v end
    end
  end
  return setmetatable(cls, {__index = parent, __call = construct, __newindex = define})
end
