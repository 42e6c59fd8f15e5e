--- moongrad.checkpoint: model:save_weights(path), model:load_weights(path)
-- and training checkpoints, in the safetensors format (mg.save, mg.load).
--
-- Names come from the layer structure, as Keras 3 names them: a layer's
-- own variables by their names within the layer ("kernel", "bias"), under
-- the path of sublayers from the model, each sublayer named by its class in
-- snake case and numbered among its siblings of that class:
--   Sequential{Dense(16), Dense(16), Dense(1)}  ->  dense/kernel, dense/bias,
--     dense_1/kernel, dense_1/bias, dense_2/kernel, dense_2/bias
-- So a model built again (in this process, where its layers get new names
-- such as dense_7, or in another, or in PyTorch) has the same names.
--
-- load_weights and restore check the whole file against the model first
-- (missing, extra, shape, dtype) and change nothing when it does not match.
-- Float weights of another float dtype are cast.
--
-- A training checkpoint holds the weights under "model/", the optimizer's
-- state (opt:get_state(vars)) under "optimizer/" (its slots by variable
-- name: optimizer/slots/m/dense/kernel), and in the metadata the epoch, the
-- state of mg.random (whose stream dropout draws from) and the optimizer's
-- numbers. Restored into the same model and optimizer, training goes on bit
-- for bit as if never stopped (fit{initial_epoch = epoch}, or a loop that
-- shuffles by epoch as mg.data does).
-- @module moongrad.checkpoint
local mg = require "moongrad"
local check = require "moongrad.check"
local class = require "moongrad.class"
local layers_mod = require "moongrad.layer"

local fail, show = check.fail, check.show

local checkpoint = {}

local WEIGHTS, CHECKPOINT = "moongrad.weights", "moongrad.checkpoint"

-- {================ names from the layer structure ================

-- "BatchNorm" -> "batch_norm", "Conv2D" -> "conv2d", "GlobalAveragePooling2D" -> "global_average_pooling2d"
local function snake (name)
  return (name:gsub("(%l)(%u)", "%1_%2"):gsub("(%u)(%u%l)", "%1_%2"):lower())
end

local function class_of (layer)
  local mt = getmetatable(layer)
  local name = type(mt) == "table" and rawget(mt, "__name")
  return snake(type(name) == "string" and name:match("([%w_]+)$") or "layer")
end

-- v's name within layer: its full name less "<layer name>/"
local function local_name (layer, v)
  local full = v.name
  local prefix = tostring(rawget(layer, "name")) .. "/"
  if full:sub(1, #prefix) == prefix then return full:sub(#prefix + 1) end
  return full:match("([^/]*)$")
end

-- adds {name, var} for layer's variables and its sublayers' to out
local function walk (layer, path, out, seen)
  if seen[layer] then return out end                -- (a layer a sublayer holds: no cycle)
  seen[layer] = true
  if rawget(layer, "_vars") then layers_mod.refresh(layer) end
  for _, v in ipairs(rawget(layer, "_vars") or {}) do
    if not seen[v] then
      seen[v] = true
      out[#out + 1] = {name = path .. local_name(layer, v), var = v}
    end
  end
  local used = {}
  for _, sub in ipairs(rawget(layer, "_layers") or {}) do
    local base = class_of(sub)
    local k = used[base]
    used[base] = (k or -1) + 1
    local part = path .. (k == nil and base or ("%s_%d"):format(base, k + 1)) .. "/"
    if rawget(sub, "_vars") or rawget(sub, "_layers") then
      walk(sub, part, out, seen)
    else                                          -- a callable table with variables of its own
      local ok, vars = pcall(function() return sub.variables end)
      if ok and type(vars) == "table" then
        for _, v in ipairs(vars) do
          if mg.is_variable(v) and not seen[v] then
            seen[v] = true
            out[#out + 1] = {name = part .. v.name:match("([^/]*)$"), var = v}
          end
        end
      end
    end
  end
  return out
end

local function is_model (v)
  return type(v) == "table" and (rawget(v, "_vars") ~= nil or rawget(v, "_layers") ~= nil)
end

--- checkpoint.names(model): the list of {name =, var =} save_weights writes,
-- one per variable of model.variables, in the structure's order.
function checkpoint.names (model, who)
  who = who or "checkpoint.names"
  if not is_model(model) then fail(who, "a model or layer expected, got %s", show(model)) end
  local out = walk(model, "", {}, {})
  local known, by_name = {}, {}
  for _, e in ipairs(out) do known[e.var] = true end
  for _, v in ipairs(model.variables) do             -- anything the walk missed keeps its own name
    if not known[v] then out[#out + 1] = {name = v.name, var = v} end
  end
  for _, e in ipairs(out) do
    if by_name[e.name] then
      fail(who, "two variables would both be saved as '%s'; give them different names", e.name)
    end
    by_name[e.name] = e
  end
  return out, by_name
end

local function built_names (model, who)
  local named, by_name = checkpoint.names(model, who)
  if #named == 0 then
    fail(who, "the model has no variables yet; build it first: model:build{nil, 20} (the input's shape, the "
         .. "batch first, nil allowed), Sequential{..., {input_shape = {20}}}, or call it on an input")
  end
  return named, by_name
end

-- }=============================================================


-- {================= matching a file to a model =================

local FLOATS = {float32 = true, float64 = true, float16 = true, bfloat16 = true}

local function some (list)
  table.sort(list)
  local n = #list
  if n > 6 then list = {list[1], list[2], list[3], list[4], list[5], ("... (%d in all)"):format(n)} end
  return "'" .. table.concat(list, "', '") .. "'"
end

-- "has no weights for ...; it has ... instead", "has 2 weights the model
-- does not: ...", or nil
local function missing_or_extra (missing, extra)
  if #missing > 0 then
    return ("has no weights for %d variable%s of the model: %s%s"):format(#missing,
           #missing == 1 and "" or "s", some(missing), #extra > 0 and ("; it has %s instead"):format(some(extra)) or "")
  end
  if #extra > 0 then
    return ("has %d weight%s the model does not: %s"):format(#extra, #extra == 1 and "" or "s", some(extra))
  end
end

-- what is wrong with file tensor t for variable v ("'dense/kernel' has shape
-- (5,6) in the file, ..."), or nil
local function mismatch (name, t, v)
  if not check.same_shape(t.shape, v.shape) then
    return ("'%s' has shape %s in the file, the model's variable has shape %s"):format(name, check.shape(t.shape),
           check.shape(v.shape))
  end
  if t.dtype ~= v.dtype and not (FLOATS[t.dtype] and FLOATS[v.dtype]) then
    return ("'%s' is %s in the file, the model's variable is %s"):format(name, t.dtype, v.dtype)
  end
end

-- the value each named variable gets from tensors[prefix .. name], all
-- checked before any is used: one error lists every mismatched, missing
-- and extra weight (a fix then needs one run, not one per tensor)
local function match (who, path, named, tensors, prefix)
  local missing, extra, values, want, wrong = {}, {}, {}, {}, {}
  for i, e in ipairs(named) do
    want[prefix .. e.name] = true
    local t, v = tensors[prefix .. e.name], e.var
    local bad = t and mismatch(e.name, t, v)
    if t == nil then missing[#missing + 1] = e.name
    elseif bad then wrong[#wrong + 1] = bad
    else values[i] = t.dtype == v.dtype and t or mg.cast(t, v.dtype)
    end
  end
  for name in pairs(tensors) do
    if name:sub(1, #prefix) == prefix and not want[name] then extra[#extra + 1] = name:sub(#prefix + 1) end
  end
  local other = missing_or_extra(missing, extra)
  if #wrong == 0 and other then fail(who, "'%s' %s", path, other) end
  if #wrong == 1 and not other then fail(who, "'%s': %s", path, wrong[1]) end
  if #wrong > 0 then
    if other then wrong[#wrong + 1] = "it " .. other end
    fail(who, "'%s' does not match the model in %d places: %s", path, #wrong, table.concat(wrong, "; "))
  end
  return values
end

local function assign_all (named, values)
  for i, e in ipairs(named) do e.var:assign(values[i]) end
end

-- }=============================================================


-- {================= save_weights, load_weights =================

--- model:save_weights(path): every variable of the model, by structural name
-- (checkpoint.names), to a safetensors file; the write is atomic.
local function save_weights (self, path)
  local who = "save_weights"
  check.value(who, "path", path, check.string)
  local tensors = {}
  for _, e in ipairs(built_names(self, who)) do tensors[e.name] = e.var end
  mg.save(path, tensors, {metadata = {format = WEIGHTS}})
  return self
end

--- model:load_weights(path): the weights save_weights wrote (or those of a
-- training checkpoint, or of any safetensors file with the same names).
-- Nothing changes unless every variable has its weights, of its shape.
local function load_weights (self, path)
  local who = "load_weights"
  check.value(who, "path", path, check.string)
  local named = built_names(self, who)
  local tensors, meta = mg.load(path)
  assign_all(named, match(who, path, named, tensors, meta.format == CHECKPOINT and "model/" or ""))
  return self
end

-- }=============================================================


-- {===================== training checkpoints =====================

-- Values in the metadata are typed strings: "i:12", "f:0.001", "b:true", "s:Adam".
local function encode (who, what, v)
  local t = math.type(v)
  if t == "integer" then return "i:" .. v end
  if t == "float" then
    if v ~= v then return "f:nan" end
    if v == math.huge or v == -math.huge then return v > 0 and "f:inf" or "f:-inf" end
    return ("f:%.17g"):format(v)
  end
  if type(v) == "boolean" then return "b:" .. tostring(v) end
  if type(v) == "string" then return "s:" .. v end
  fail(who, "%s is %s; a checkpoint holds tensors, numbers, booleans and strings", what, show(v))
end

local function decode (who, path, key, s)
  local tag, body = s:match("^(%a):(.*)$")
  if tag == "i" and math.tointeger(tonumber(body)) then return math.tointeger(tonumber(body)) end
  if tag == "f" then
    if body == "nan" then return 0 / 0 end
    if body == "inf" then return math.huge end
    if body == "-inf" then return -math.huge end
    local v = tonumber(body)
    if v then return v + 0.0 end
  end
  if tag == "b" and (body == "true" or body == "false") then return body == "true" end
  if tag == "s" then return body end
  if tag == "t" and body == "" then return {} end
  fail(who, "'%s': metadata '%s' is '%s', not a value this module wrote", path, key, s)
end

-- A nested table of state into tensors (name -> tensor) and meta (key ->
-- typed string), under prefix; "t:" marks each table, so empty ones come back.
local function flatten (who, prefix, v, tensors, meta)
  if check.is_array(v) then
    tensors[prefix] = v
  elseif type(v) == "table" and getmetatable(v) == nil then
    meta[prefix] = "t:"
    for k, x in pairs(v) do
      local part = math.type(k) == "integer" and ("#%d"):format(k) or k
      if type(part) ~= "string" or part:find("/", 1, true) or part:sub(1, 1) == "#" and math.type(k) ~= "integer" then
        fail(who, "%s has a key %s; state tables take names without '/' and integers", prefix, show(k))
      end
      flatten(who, prefix .. "/" .. part, x, tensors, meta)
    end
  else
    meta[prefix] = encode(who, prefix, v)
  end
end

-- the inverse of flatten: the table stored under prefix, or nil
local function unflatten (who, path, prefix, tensors, meta)
  local root
  local function put (key, value)
    local rest = key:sub(#prefix + 2)
    if key == prefix then
      if root == nil then root = value end
      return
    end
    root = root or {}
    local t = root
    local parts = {}
    for part in rest:gmatch("[^/]+") do parts[#parts + 1] = part end
    for i, part in ipairs(parts) do
      local k = part:match("^#(%-?%d+)$")
      k = k and math.tointeger(tonumber(k)) or part
      if i == #parts then
        if type(t[k]) ~= "table" or type(value) ~= "table" then t[k] = value end
      else
        if type(t[k]) ~= "table" then t[k] = {} end
        t = t[k]
      end
    end
  end
  local function under (key) return key == prefix or key:sub(1, #prefix + 1) == prefix .. "/" end
  local keys = {}
  for key in pairs(meta) do if under(key) then keys[#keys + 1] = key end end
  table.sort(keys)                                   -- parents before children
  for _, key in ipairs(keys) do put(key, decode(who, path, key, meta[key])) end
  for key, t in pairs(tensors) do if under(key) then put(key, t) end end
  return root
end

-- the optimizer's variables: the model's trainable ones, in structural order
local function trainable (named)
  local vars, names = {}, {}
  for _, e in ipairs(named) do
    if e.var.trainable then vars[#vars + 1], names[#names + 1] = e.var, e.name end
  end
  return vars, names
end

local SAVE_OPTIONS = {{"model", check.rule("a model", is_model)}, {"optimizer", check.rule("an optimizer", function(v)
  return type(v) == "table" and check.is_callable(v.get_state) end)}, {"epoch", check.integer}, {"rng", check.rule(
  "true, false or a state {seed =, offset =}", function(v) return type(v) == "boolean" or type(v) == "table" end), true},
  {"metadata", check.rule("a table of strings", function(v) return type(v) == "table" end)}}

local RESERVED = {format = true, epoch = true, optimizer = true, model = true, rng = true}

--- checkpoint.save(path, {model=, optimizer=, epoch=, rng=true, metadata=}):
-- the model's weights, the optimizer's state, the epoch and mg.random's
-- state (rng = true: the current one; a table: that one; false: none) to one
-- safetensors file, atomically. metadata: more strings to keep.
function checkpoint.save (path, state)
  local who = "checkpoint.save"
  check.value(who, "path", path, check.string)
  local o = check.options(who, state, SAVE_OPTIONS)
  local tensors, meta = {}, {format = CHECKPOINT}
  local named = o.model and built_names(o.model, who)
  if o.model then
    for _, e in ipairs(named) do tensors["model/" .. e.name] = e.var end
  end
  if o.optimizer then
    if not o.model then fail(who, "an optimizer's state is saved with its model: give model = too") end
    local vars, names = trainable(named)
    local st = o.optimizer:get_state(vars)
    local slots = st.slots or {}
    local rest = {}
    for k, v in pairs(st) do if k ~= "slots" then rest[k] = v end end
    flatten(who, "optimizer", rest, tensors, meta)
    meta["optimizer/slots"] = "t:"
    for slot, list in pairs(slots) do
      meta["optimizer/slots/" .. slot] = "t:"
      for i, name in ipairs(names) do
        if list[i] == nil then fail(who, "the optimizer's slot '%s' has no tensor for '%s'", slot, name) end
        tensors["optimizer/slots/" .. slot .. "/" .. name] = list[i]
      end
    end
  end
  if o.epoch then meta.epoch = encode(who, "epoch", o.epoch) end
  if o.rng then
    local r = o.rng == true and mg.random.get_state() or o.rng
    if math.type(r.seed) ~= "integer" or math.type(r.offset) ~= "integer" then
      fail(who, "option 'rng' must be true, false or {seed = integer, offset = integer}, got %s", show(r))
    end
    meta["rng/seed"], meta["rng/offset"] = encode(who, "rng", r.seed), encode(who, "rng", r.offset)
  end
  for k, v in pairs(o.metadata or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      fail(who, "option 'metadata' must map strings to strings, got %s = %s", show(k), show(v))
    end
    if RESERVED[k] or k:find("/", 1, true) then fail(who, "metadata key '%s' is reserved (or has a '/')", k) end
    meta[k] = v
  end
  mg.save(path, tensors, {metadata = meta})
end

local RESTORE_OPTIONS = {{"model", check.rule("a model", is_model)}, {"optimizer", check.rule("an optimizer", function(v)
  return type(v) == "table" and check.is_callable(v.set_state) end)}, {"rng", check.boolean, true}}

--- checkpoint.restore(path, {model=, optimizer=, rng=true}) -> info: puts back
-- what checkpoint.save wrote: the weights into model (built), the state into
-- optimizer, and mg.random's state (unless rng = false). Everything is
-- checked before anything changes. info = {epoch =, rng = {seed =, offset =},
-- metadata = {the strings given to save}}; resume with fit{initial_epoch = info.epoch}.
function checkpoint.restore (path, opts)
  local who = "checkpoint.restore"
  check.value(who, "path", path, check.string)
  local o = check.options(who, opts, RESTORE_OPTIONS)
  local tensors, meta = mg.load(path)
  if meta.format ~= CHECKPOINT then
    fail(who, "'%s' is not a training checkpoint (no format = %s in its metadata)%s", path, CHECKPOINT,
         meta.format == WEIGHTS and "; it holds weights: use model:load_weights(path)" or "")
  end
  local named, values
  if o.model then
    named = built_names(o.model, who)
    values = match(who, path, named, tensors, "model/")
  end
  local rng
  if meta["rng/seed"] then
    rng = {seed = decode(who, path, "rng/seed", meta["rng/seed"]), offset = decode(who, path, "rng/offset", meta["rng/offset"] or "")}
  end
  if o.optimizer then
    if not o.model then fail(who, "an optimizer's state is restored with its model: give model = too") end
    local st = unflatten(who, path, "optimizer", tensors, meta)
    if st == nil then fail(who, "'%s' holds no optimizer state", path) end
    local vars, names = trainable(named)
    local slots = {}
    for slot in pairs(st.slots or {}) do
      local list = {}
      for i, name in ipairs(names) do
        list[i] = tensors["optimizer/slots/" .. slot .. "/" .. name]
        if list[i] == nil then fail(who, "'%s' has no optimizer slot '%s' for '%s'", path, slot, name) end
      end
      slots[slot] = list
    end
    st.slots = slots
    o.optimizer:set_state(st, vars)                  -- checks the whole state before changing it
  end
  if o.model then assign_all(named, values) end
  if o.rng and rng then mg.random.set_state(rng) end
  local user = {}
  for k, v in pairs(meta) do
    if not RESERVED[k] and not k:find("/", 1, true) then user[k] = v end
  end
  return {epoch = meta.epoch and decode(who, path, "epoch", meta.epoch), rng = rng, metadata = user}
end

-- {---- the fit callback ----

local Callback = class("moongrad.checkpoint.Callback")

-- path with {epoch}, {epoch:03d}, {val_loss:.4f} ... filled from epoch and logs
local function fill (path, epoch, logs)
  return (path:gsub("{([%w_]+):?([^}]*)}", function(key, spec)
    local v = key == "epoch" and epoch or logs and logs[key]
    if v == nil then return nil end
    if spec == "" then return tostring(v) end
    local ok, s = pcall(string.format, "%" .. spec, v)
    return ok and s or tostring(v)
  end))
end

function Callback:set_model (model) self.model = model end

-- Under mg.distributed rank 0 writes for all (every rank holds the same
-- weights); a sharded optimizer's state is gathered from every rank first (a
-- collective), so every rank takes part. Returns whether this rank writes,
-- and the optimizer to save.
local function for_rank0 (model, opt)
  local dist = package.loaded["moongrad.distributed"]
  local writes = not (dist and dist.is_initialized() and dist.rank() ~= 0)
  if opt ~= nil and opt.collective_state then
    local st = opt:get_state(trainable(built_names(model, "checkpoint.callback")))
    opt = {get_state = function() return st end}
  end
  return writes, opt
end

function Callback:on_epoch_end (epoch, logs)
  if epoch % self.every ~= 0 then return end
  local model = self.model
  if model == nil then fail("checkpoint.callback", "no model: fit gives it through set_model") end
  local writes, opt = for_rank0(model, self.optimizer or rawget(model, "optimizer"))
  if not writes then return end
  checkpoint.save(fill(self.path, epoch, logs), {model = model, epoch = epoch, optimizer = opt})
end

local CALLBACK_OPTIONS = {{"every", check.positive_integer, 1}, {"optimizer", check.rule("an optimizer", function(v)
  return type(v) == "table" and check.is_callable(v.get_state) end)}}

--- checkpoint.callback(path, {every=1}): a fit callback that saves a training
-- checkpoint (model, model.optimizer, epoch, mg.random's state) after every
-- `every`-th epoch. path may hold {epoch} or {epoch:03d} and the logs'
-- entries ({val_loss:.4f}), as Keras' ModelCheckpoint. Under mg.distributed
-- only rank 0 writes (every rank holds the same weights).
function checkpoint.callback (path, opts)
  local who = "checkpoint.callback"
  check.value(who, "path", path, check.string)
  local o = check.options(who, opts, CALLBACK_OPTIONS)
  return setmetatable({path = path, every = o.every, optimizer = o.optimizer}, Callback)
end

-- }----

-- {---- BackupAndRestore ----

local Backup = class("moongrad.callbacks.BackupAndRestore")

local shell_quote = require("moongrad.data")._shell_quote

local function exists (path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

function Backup:set_model (model) self.model = model end
function Backup:set_params (params) self.params = params end

-- a backup from a run that stopped: the model (built first if it never ran),
-- its optimizer and mg.random's state come back, and fit goes on after its epoch
function Backup:on_train_begin ()
  local who, model = "BackupAndRestore", self.model
  if not exists(self.path) then return end
  if #model.variables == 0 then model:build(self.params.input_shape, self.params.input_dtype) end
  local info = checkpoint.restore(self.path, {model = model, optimizer = rawget(model, "optimizer")})
  if info.epoch == nil then fail(who, "'%s' holds no epoch: it is not this callback's backup", self.path) end
  rawset(model, "_resume_epoch", info.epoch)
end

-- saves are atomic (mg.save), so a run killed while writing leaves the last backup whole
function Backup:on_epoch_end (epoch)
  local writes, opt = for_rank0(self.model, rawget(self.model, "optimizer"))
  if not writes then return end
  checkpoint.save(self.path, {model = self.model, epoch = epoch, optimizer = opt})
end

-- training ended (its last epoch, or stopped by a callback): no run to resume
function Backup:on_train_end ()
  local dist = package.loaded["moongrad.distributed"]
  if dist and dist.is_initialized() and dist.rank() ~= 0 then return end
  os.remove(self.path)
end

--- BackupAndRestore{backup_dir=} (Keras' callback, mg.callbacks): fit saves
-- a training checkpoint into backup_dir after each epoch (made if missing);
-- a fit run again after a crash finds it, restores the model (building it if
-- needed), its optimizer and mg.random's state, and goes on after the saved
-- epoch, bit for bit as if never stopped; a fit that ends removes it.
function checkpoint.BackupAndRestore (opts)
  local who = "BackupAndRestore"
  if type(opts) == "string" then opts = {backup_dir = opts} end
  local o = check.options(who, opts, {{"backup_dir", check.string}})
  local dir = o.backup_dir
  if dir == nil then fail(who, "backup_dir is required: BackupAndRestore{backup_dir = \"backups\"}") end
  if dir == "" or dir:find("[%z\n]") then
    fail(who, "backup_dir must be a directory's path, not empty and without NUL bytes or newlines")
  end
  if not os.execute("mkdir -p -- " .. shell_quote(dir) .. " 2>/dev/null") then
    fail(who, "cannot make the directory '%s'", dir)
  end
  return setmetatable({path = dir .. "/backup.safetensors"}, Backup)
end

-- }----

-- }=============================================================

--- the methods of every layer (mg.nn copies them into Layer on first use)
checkpoint.layer_methods = {save_weights = save_weights, load_weights = load_weights}

return check.export(checkpoint)          -- errors name the user's line (moongrad.check)
