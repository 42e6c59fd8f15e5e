-- Installing: `make deps` (the Makefile's real recipe and DEPS, run against stub
-- dpkg, apt-get, sudo and id, so nothing is installed and the machine's own packages
-- do not matter) and the rockspec (`luarocks make` into a temporary tree, then stock
-- lua5.4 loading the module from there alone).
local h = require "helpers"

local function q (s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- the first line a shell command prints
local function line (cmd)
  local out, code = h.run(cmd)
  assert(code == 0, cmd .. ": " .. out)
  return out:match("^([^\n]*)")
end

local root = line("pwd -P")
local make = line("command -v make")

local function write (path, text, mode)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  if mode then assert(os.execute("chmod " .. mode .. " " .. q(path))) end
end

local function lines (path)
  local t = {}
  local f = io.open(path)
  if not f then return t end
  for l in f:lines() do t[#t + 1] = l end
  f:close()
  return t
end

-- fresh temporary directories, removed after each test, pass or fail
local temps = {}
local function tempdir ()
  local dir = line("mktemp -d")
  temps[#temps + 1] = dir
  return dir
end
local function remove_temps ()
  for i = #temps, 1, -1 do
    os.execute("rm -rf " .. q(temps[i]))
    temps[i] = nil
  end
end

-- make's own variables from an outer `make test` (jobserver, command-line
-- overrides such as DEPS=...) must not reach the make under test
local CLEAN_ENV = "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES"

describe("make deps", function()
  after_each(remove_temps)
  local apt = "apt-get -o DPkg::Lock::Timeout=300 "
  local sudo_apt = "sudo env DEBIAN_FRONTEND=noninteractive " .. apt

  -- the DEPS list as the Makefile expands it
  local deps = {}
  local out = line(CLEAN_ENV .. " " .. make .. " -s --no-print-directory -C " .. q(root) ..
                   " --eval 'mg-print-deps: ; @echo $(DEPS)' mg-print-deps")
  for p in out:gmatch("%S+") do deps[#deps + 1] = p end

  -- runs `make -s deps` with PATH holding only the stubs (and a few plain tools), so
  -- the real dpkg, apt-get and sudo cannot be reached. opts: uid, installed (set of
  -- packages dpkg reports installed), config_files (removed but not purged: dpkg -s
  -- answers, with another Status), sudo (false: none on PATH), apt_fails ("update"
  -- or "install"). Returns make's output and status, and the stubs' log by stub.
  local function run_deps (opts)
    local dir = tempdir()
    local bin, log = dir .. "/bin", dir .. "/log"
    assert(os.execute("mkdir " .. q(bin)))
    for _, tool in ipairs({"env", "grep", "sed", "tr", "cat", "head", "tail", "cut", "sort", "awk"}) do
      os.execute("p=$(command -v " .. tool .. ") && ln -s \"$p\" " .. q(bin .. "/" .. tool))
    end
    local installed, config_files = {}, {}
    for p in pairs(opts.installed or {}) do installed[#installed + 1] = p end
    for p in pairs(opts.config_files or {}) do config_files[#config_files + 1] = p end
    local L = q(log)
    write(bin .. "/dpkg", table.concat({
      "#!/bin/sh",
      "printf 'dpkg %s\\n' \"$*\" >> " .. L,
      "[ \"$1\" = -s ] && [ $# = 2 ] || exit 2",
      "case ' " .. table.concat(installed, " ") .. " ' in *\" $2 \"*)",
      "  printf 'Package: %s\\nStatus: install ok installed\\nPriority: optional\\n' \"$2\"; exit 0;; esac",
      "case ' " .. table.concat(config_files, " ") .. " ' in *\" $2 \"*)",
      "  printf 'Package: %s\\nStatus: deinstall ok config-files\\n' \"$2\"; exit 0;; esac",
      "printf \"dpkg-query: package '%s' is not installed and no information is available\\n\" \"$2\" >&2",
      "exit 1", ""}, "\n"), "+x")
    write(bin .. "/apt-get", table.concat({
      "#!/bin/sh",
      "printf 'apt-get %s [DEBIAN_FRONTEND=%s]\\n' \"$*\" \"${DEBIAN_FRONTEND-unset}\" >> " .. L,
      "case \" $* \" in *' " .. (opts.apt_fails or "none") .. " '*)",
      "  echo 'E: stub apt-get fails' >&2; exit 100;; esac",
      "exit 0", ""}, "\n"), "+x")
    write(bin .. "/id", table.concat({
      "#!/bin/sh",
      "printf 'id %s\\n' \"$*\" >> " .. L,
      "[ \"$1\" = -u ] && echo " .. opts.uid .. " || echo 'uid=" .. opts.uid .. "(stub)'", ""}, "\n"), "+x")
    if opts.sudo ~= false then
      -- like sudo's env_reset: the command gets a clean environment
      write(bin .. "/sudo", table.concat({
        "#!/bin/sh",
        "printf 'sudo %s\\n' \"$*\" >> " .. L,
        "exec env -i PATH=\"$PATH\" \"$@\"", ""}, "\n"), "+x")
    end
    local body, code = h.run(CLEAN_ENV .. " -u DEBIAN_FRONTEND PATH=" .. q(bin) .. " " .. make ..
                             " -s --no-print-directory -C " .. q(root) .. " deps")
    local by = {dpkg = {}, id = {}, run = {}}
    for _, l in ipairs(lines(log)) do
      local stub = l:match("^(%S+)")
      table.insert(by[stub] or by.run, l)
    end
    return body, code, by
  end

  -- every DEPS package but the 1st, 3rd and last is installed (the 3rd as config files only)
  local function some_missing ()
    local installed, missing = {}, {}
    for i, p in ipairs(deps) do
      if i == 1 or i == 3 or i == #deps then missing[#missing + 1] = p
      else installed[p] = true end
    end
    return installed, table.concat(missing, " "), {[deps[3]] = true}
  end

  local function all_asked (by)
    local asked = {}
    for i, p in ipairs(deps) do asked[i] = "dpkg -s " .. p end
    assert.same(asked, by.dpkg)
  end

  it("reads the real DEPS list", function()
    assert.is_true(#deps >= 4, out)
    for _, p in ipairs({"lua5.4", "liblua5.4-dev", "lua-busted", "libdnnl-dev", "luarocks"}) do
      assert.truthy(out:find(p, 1, true), p)
    end
  end)

  it("as root, runs apt-get directly for exactly the missing packages", function()
    local installed, missing, config_files = some_missing()
    local body, code, by = run_deps({uid = 0, installed = installed, config_files = config_files})
    assert.equal(0, code, body)
    all_asked(by)
    assert.same({
      apt .. "update -qq [DEBIAN_FRONTEND=noninteractive]",
      apt .. "install -y -qq --no-install-recommends " .. missing .. " [DEBIAN_FRONTEND=noninteractive]",
    }, by.run)
    assert.equal("make deps: installing Debian packages: " .. missing .. "\n", body)
  end)

  it("as a user, runs apt-get through sudo", function()
    local installed, missing, config_files = some_missing()
    local body, code, by = run_deps({uid = 1000, installed = installed, config_files = config_files})
    assert.equal(0, code, body)
    all_asked(by)
    assert.same({
      sudo_apt .. "update -qq",
      apt .. "update -qq [DEBIAN_FRONTEND=noninteractive]",
      sudo_apt .. "install -y -qq --no-install-recommends " .. missing,
      apt .. "install -y -qq --no-install-recommends " .. missing .. " [DEBIAN_FRONTEND=noninteractive]",
    }, by.run)
    assert.equal("make deps: installing Debian packages (through sudo): " .. missing .. "\n", body)
  end)

  it("does nothing, silently, when every package is installed", function()
    local installed = {}
    for _, p in ipairs(deps) do installed[p] = true end
    for _, uid in ipairs({0, 1000}) do
      local body, code, by = run_deps({uid = uid, installed = installed})
      assert.equal(0, code, body)
      assert.equal("", body)
      all_asked(by)
      assert.same({}, by.run)
    end
  end)

  it("as a user without sudo, says what to install and fails", function()
    local installed, missing = some_missing()
    local body, code, by = run_deps({uid = 1000, installed = installed, sudo = false})
    assert.not_equal(0, code, body)
    assert.same({}, by.run)
    assert.truthy(body:find("not root and no sudo", 1, true), body)
    assert.truthy(body:find("apt-get install " .. missing, 1, true), body)
    assert.truthy(body:find("%*%*%* %[[^\n]*deps%] Error"), body)
  end)

  it("fails, and make says so, when apt-get fails", function()
    local installed, missing = some_missing()
    for _, step in ipairs({"update", "install"}) do
      for _, uid in ipairs({0, 1000}) do
        local body, code, by = run_deps({uid = uid, installed = installed, apt_fails = step})
        assert.not_equal(0, code, body)
        local n = (step == "update" and 1 or 2) * (uid == 0 and 1 or 2)
        assert.equal(n, #by.run, table.concat(by.run, "\n"))
        assert.truthy(body:find("make deps: apt-get failed; could not install: " .. missing, 1, true), body)
        assert.truthy(body:find("%*%*%* %[[^\n]*deps%] Error"), body)
      end
    end
  end)
end)

describe("luarocks", function()
  after_each(remove_temps)
  it("luarocks make builds and installs the module for stock lua5.4", function()
    local tmp = tempdir()
    local src, tree, cwd = tmp .. "/src", tmp .. "/tree", tmp .. "/cwd"
    -- a copy of the checkout: the rock's build (build/rock) stays out of the project
    assert(os.execute("mkdir " .. q(src) .. " " .. q(cwd) .. " && cd " .. q(root) ..
                      " && cp -R Makefile README.md src include lua " .. q(src)))
    local out, code = h.run("cd " .. q(src) .. " && " .. CLEAN_ENV .. " MAKEFLAGS=-j2" ..
                            " luarocks --lua-version=5.4 --tree=" .. q(tree) .. " make lua/moongrad-scm-1.rockspec")
    assert.equal(0, code, out)
    assert.truthy(out:find("moongrad scm-1 is now installed", 1, true), out)
    -- nothing at run time may need the build
    assert(os.execute("rm -rf " .. q(src)))

    local so = tree .. "/lib/lua/5.4/moongrad.so"
    local script = [[
      local mg = require "moongrad"
      print(package.searchpath("moongrad", package.cpath))
      print(mg.sum(mg.ones{2, 3}):item())
      local nn = require "moongrad.nn"
      print(type(nn), nn == mg.nn)
    ]]
    out, code = h.run("cd " .. q(cwd) .. " && env -u LUA_INIT -u LUA_INIT_5_4 LUA_CPATH_5_4=" ..
                      q(tree .. "/lib/lua/5.4/?.so") .. " LUA_PATH_5_4=" .. q(tree .. "/share/lua/5.4/?.lua") ..
                      " lua5.4 -e " .. q(script))
    assert.equal(0, code, out)
    assert.equal(so .. "\n6.0\ntable\ttrue\n", out)
  end)
end)
