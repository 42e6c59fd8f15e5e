-- The REPL on a terminal: Tab completion, the history file, Ctrl-C.
-- Each test drives the binary in its own tmux server (socket, HOME and
-- history inside a temporary directory) and polls the screen every 50 ms,
-- with a generous bound, so a slow (ASan, loaded) machine only waits longer.
local h = require "helpers"

local TIMEOUT = 30        -- seconds for any one wait

local has_system, system = pcall(require, "system")
local function sleep (s)
  if has_system then system.sleep(s) else os.execute("sleep " .. s) end
end

local function quote (s)
  return "'" .. s:gsub("'", [['\'']]) .. "'"
end

-- runs a shell command; returns its stdout and whether it succeeded
local function shell (cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  local out = p:read("a")
  return out, p:close()
end

local function trim (s)
  return (s:gsub("%s+$", ""))
end

local cwd = trim(shell("pwd"))
local bin = h.bin:sub(1, 1) == "/" and h.bin or cwd .. "/" .. h.bin

local Tty = {}
Tty.__index = Tty

-- tmux subcommand on this session's server; returns its output
function Tty:tmux (args)
  return shell(self.prefix .. " " .. args)
end

-- the process running busted (the parent of io.popen's shell)
local owner = trim(shell("echo $PPID"))

-- starts the REPL in dir (HOME, tmux socket, sanitizer logs); history is
-- dir/history unless given. A small script runs it and writes its exit
-- status to dir/status. The script traps SIGINT, which the terminal sends
-- to the whole pane (the REPL gets the default back on exec), and a
-- watchdog ends the tmux server and removes dir if busted dies before
-- after_each runs.
local function start (dir, history)
  local self = setmetatable({dir = dir}, Tty)
  self.prefix = "env TMUX_TMPDIR=" .. quote(dir) .. " tmux -L moongrad -f /dev/null"
  os.remove(dir .. "/status")
  local env = {
    "HOME=" .. quote(dir),
    "MOONGRAD_HISTORY=" .. quote(history or dir .. "/history"),
    "ASAN_OPTIONS=" .. quote((os.getenv("ASAN_OPTIONS") or "") .. ":log_path=" .. dir .. "/asan"),
    "UBSAN_OPTIONS=" .. quote((os.getenv("UBSAN_OPTIONS") or "") .. ":log_path=" .. dir .. "/ubsan"),
  }
  local f = assert(io.open(dir .. "/run.sh", "w"))
  f:write("trap true INT\n",
          "(while kill -0 ", owner, " && [ -d ", quote(dir), " ]; do sleep 1; done; ",
          self.prefix, " kill-server; rm -rf ", quote(dir), ") >/dev/null 2>&1 &\n",
          "env ", table.concat(env, " "), " ", quote(bin), "\n",
          "echo $? > ", quote(dir .. "/status"), "\n")
  f:close()
  local _, ok = self:tmux("new-session -d -s mg -x 200 -y 50 -c " .. quote(cwd) .. " "
                         .. quote("exec sh " .. quote(dir .. "/run.sh")))
  assert(ok, "cannot start tmux")
  return self
end

-- the REPL's exit status once it has exited, else nil
function Tty:status ()
  local f = io.open(self.dir .. "/status")
  if not f then return nil end
  local status = f:read("l")
  f:close()
  return status
end

function Tty:kill ()
  self:tmux("kill-server")
end

function Tty:screen ()
  return self:tmux("capture-pane -p -t mg")
end

-- the screen's lines, trailing blanks cut
function Tty:lines ()
  local lines = {}
  for l in (self:screen() .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = trim(l) end
  while #lines > 0 and lines[#lines] == "" do lines[#lines] = nil end
  return lines
end

-- polls until ok(lines) holds; fails showing the screen after TIMEOUT, or
-- at once if the REPL has exited (unless exit is what it waits for)
function Tty:wait (ok, what, exiting)
  local deadline = os.time() + TIMEOUT
  repeat
    local lines = self:lines()
    if ok(lines) then return lines end
    local status = not exiting and self:status()
    if status then
      error("the REPL exited (status " .. status .. ") while waiting for " .. what
            .. "; the screen:\n" .. self:screen(), 2)
    end
    sleep(0.05)
  until os.time() > deadline
  error("timed out waiting for " .. what .. "; the screen:\n" .. self:screen(), 2)
end

-- the line being edited (the last one) is s
function Tty:wait_line (s)
  return self:wait(function(lines) return lines[#lines] == s end, ("line %q"):format(s))
end

-- some line of the screen contains s
function Tty:wait_text (s)
  return self:wait(function(lines)
    for _, l in ipairs(lines) do if l:find(s, 1, true) then return true end end
  end, ("text %q"):format(s))
end

-- some line of the screen is exactly s
function Tty:wait_output (s)
  return self:wait(function(lines)
    for _, l in ipairs(lines) do if l == s then return true end end
  end, ("output line %q"):format(s))
end

function Tty:keys (...)
  self:tmux("send-keys -t mg " .. table.concat({...}, " "))
end

-- types text (without Enter) and waits until it shows after the prompt
function Tty:type (text, prompt)
  self:tmux("send-keys -t mg -l " .. quote(text))
  self:wait_line((prompt or ">") .. " " .. text)
end

-- enters a line and waits for the next prompt
function Tty:enter (text)
  self:type(text)
  self:keys("Enter")
  self:wait_line(">")
end

-- ends the session with Ctrl-D: it must exit 0 with no sanitizer report
function Tty:finish ()
  self:keys("C-d")
  self:wait(function() return self:status() end, "the REPL to exit", true)
  local report = shell("cat " .. quote(self.dir) .. "/asan* " .. quote(self.dir) .. "/ubsan*")
  assert.equal("", report, "sanitizer report")
  assert.equal("0", self:status())
end

-- A machine without pseudo-terminals (a chroot without /dev/pts) cannot
-- run a terminal program at all: there the tests are pending, and say why.
local function has_ptys ()
  local dir = trim(shell("mktemp -d"))
  local _, ok = shell("env TMUX_TMPDIR=" .. quote(dir) .. " tmux -L probe -f /dev/null new-session -d true")
  shell("env TMUX_TMPDIR=" .. quote(dir) .. " tmux -L probe kill-server; rm -rf " .. quote(dir))
  return ok
end

describe("the REPL on a terminal", function()
  local dir, tty
  if not has_ptys() then
    it = function(name) pending(name .. ": tmux cannot open a pseudo-terminal here (is /dev/pts mounted?)") end
  end

  before_each(function()
    dir = trim(shell("mktemp -d " .. quote((os.getenv("TMPDIR") or "/tmp") .. "/moongrad-tty.XXXXXX")))
    assert.truthy(dir ~= "", "cannot make a temporary directory")
    tty = nil
  end)

  after_each(function()
    if tty then tty:kill() end
    os.execute("rm -rf " .. quote(dir))
  end)

  local function open (history)
    tty = start(dir, history)
    tty:wait_line(">")
    return tty
  end

  it("completes globals, fields, methods and keywords on Tab", function()
    local t = open()
    for _, case in ipairs{
      {"mg.mat", "mg.matmul"}, {"mg.nn.De", "mg.nn.Dense"}, {"mg.memory.st", "mg.memory.stats"},
      {"mg.nn.RevB", "mg.nn.RevBlock"},               -- a class that loads on first use,
      {"mg.nn.RevBlock.inv", "mg.nn.RevBlock.inverse"},   -- and its methods
      {"whi", "while"}, {"pri", "print"}, {"string.for", "string.format"},
    } do
      t:type(case[1])
      t:keys("Tab")
      t:wait_line("> " .. case[2])
      t:keys("C-u")
      t:wait_line(">")
    end
    t:enter("x = mg.ones{2,3}")
    t:type("x:res")
    t:keys("Tab")
    t:wait_line("> x:reshape")
    t:keys("C-u")
    t:type("x:s")
    t:keys("Tab", "Tab")                      -- the second Tab lists the candidates
    local listing
    t:wait(function(lines)
      listing = table.concat(lines, "\n")
      return lines[#lines] == "> x:s" and listing:find("x:sum", 1, true)
    end, "the list of x:s methods")
    for _, m in ipairs{"x:sub", "x:softmax", "x:sqrt", "x:slice"} do
      assert.truthy(listing:find(m, 1, true), m .. " not listed")
    end
    assert.falsy(listing:find("x:shape", 1, true))   -- a property, not a method
    t:keys("C-u")
    t:wait_line(">")
    t:finish()
  end)

  it("completes variables' methods and class methods without calling __index", function()
    local t = open()
    t:enter("v = Variable(mg.ones{2})")
    t:type("v:assign_a")
    t:keys("Tab")
    t:wait_line("> v:assign_add")
    t:keys("C-u")
    t:type("v.sha")
    t:keys("Tab")
    t:wait_line("> v.shape")
    t:keys("C-u")
    t:enter("calls = 0")
    t:enter("obj = setmetatable({}, {__index = function() calls = calls + 1 end})")
    t:type("obj.x")
    t:keys("Tab")
    t:keys("C-u")
    t:wait_line(">")
    t:enter("=calls")
    t:wait_output("0")
    t:finish()
  end)

  it("keeps the history across sessions in $MOONGRAD_HISTORY", function()
    local t = open()
    t:enter("history_marker = 12345")
    t:finish()
    t:kill()
    local f = assert(io.open(dir .. "/history"))
    local saved = f:read("a")
    f:close()
    assert.truthy(saved:find("history_marker = 12345", 1, true))
    t = open()
    t:enter("history_marker = 0")
    t:keys("Up", "Up")
    t:wait_line("> history_marker = 12345")
    t:keys("Enter")
    t:wait_line(">")
    t:enter("=history_marker")
    t:wait_output("12345")
    t:finish()
  end)

  it("goes on without history when the file cannot be written", function()
    local t = open(dir .. "/missing/history")
    t:wait_text("history not saved")
    t:enter("1+1")
    t:wait_output("2")
    t:finish()
  end)

  it("drops the line being typed on Ctrl-C and keeps the session", function()
    local t = open()
    t:type("half typed")
    t:keys("C-c")
    t:wait_line(">")
    t:wait_text("> half typed^C")
    t:enter("1+1")
    t:wait_output("2")
    t:type("for i = 1, 3 do")                 -- an unfinished statement is dropped too
    t:keys("Enter")
    t:wait_line(">>")
    t:keys("C-c")
    t:wait_line(">")
    t:enter("print('after' .. 'wards')")
    t:wait_output("afterwards")
    assert.falsy(table.concat(t:lines(), "\n"):find("expected", 1, true))
    t:finish()
  end)

  it("stops a Lua loop on Ctrl-C with 'interrupted!'", function()
    local t = open()
    t:type("print('start' .. 'ed') while true do end")
    t:keys("Enter")
    t:wait_output("started")
    t:keys("C-c")
    t:wait_text("interrupted!")
    t:wait_line(">")
    t:enter("1+1")
    t:wait_output("2")
    t:finish()
  end)

  it("stops a loop of C ops on Ctrl-C", function()
    local t = open()
    t:enter("a = mg.ones{64,64}")
    t:type("print('start' .. 'ed') for i = 1, 1e9 do local y = mg.matmul(a, a) end")
    t:keys("Enter")
    t:wait_output("started")
    t:keys("C-c")
    t:wait_text("interrupted")
    t:wait_line(">")
    t:enter("1+1")
    t:wait_output("2")
    t:finish()
  end)
end)
