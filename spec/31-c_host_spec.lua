-- A C host as a newcomer builds one: `make install` into a DESTDIR, then the link
-- line of docs/embedding.md, `cc host.c $(pkg-config --cflags --libs moongrad)`, on
-- the embedding example (examples/embed_host.c, the one that page shows), and its run.
local h = require "helpers"

local function q (s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function sh (cmd)
  local out, code = h.run(cmd)
  assert.equal(0, code, cmd .. ":\n" .. out)
  return out
end

-- the build under test (build-<you>/moongrad: build-<you>), so install copies it as it is
local build = h.bin:match("^(.*)/[^/]*$") or "build"
local CLEAN_ENV = "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES"

describe("a C host through pkg-config", function()
  local tmp
  before_each(function() tmp = sh("mktemp -d"):match("^(%S+)") end)
  after_each(function() os.execute("rm -rf " .. q(tmp)) end)

  it("make install puts moongrad.pc beside the library, and the example links and runs with it", function()
    sh(CLEAN_ENV .. " make -s --no-print-directory BUILD=" .. q(build) .. " install DESTDIR=" .. q(tmp) ..
       " PREFIX=/usr 2>&1")
    local pcdir = tmp .. "/usr/lib/pkgconfig"
    local pc = assert(io.open(pcdir .. "/moongrad.pc")):read("a")
    assert.truthy(pc:find("\nprefix=/usr\n", 1, true), pc)
    -- what libmoongrad.a needs: OpenMP, oneDNN, OpenBLAS' OpenMP build found at run time, Lua
    local pkg = "PKG_CONFIG_PATH=" .. q(pcdir) .. " pkg-config --define-variable=prefix=" .. q(tmp .. "/usr")
    local flags = sh(pkg .. " --cflags --libs moongrad"):gsub("%s+$", "")
    for _, want in ipairs({"-I" .. tmp .. "/usr/include", "-L" .. tmp .. "/usr/lib", "-lmoongrad", "-lgomp",
                           "-ldnnl", "-lopenblas", "-Wl,-rpath,", "-llua5.4", "-lcjson", "-lz", "-lm"}) do
      assert.truthy(flags:find(want, 1, true), want .. " in " .. flags)
    end
    assert.equal(sh("sed -n 's/^#define MG_VERSION  *\"moongrad \\(.*\\)\"/\\1/p' include/moongrad.h"),
                 sh(pkg .. " --modversion moongrad"))
    -- docs/embedding.md's line, word for word but for where the .pc file lies
    -- a sanitized build under test (make asan) needs its runtime in the host too
    local nm = h.run("nm " .. q(build .. "/libmoongrad.a") .. " 2>/dev/null | grep -c __asan_")
    local sanitized = (tonumber(nm:match("%d+")) or 0) > 0 and " -fsanitize=address,undefined" or ""
    sh("cc -o " .. q(tmp .. "/embed_host") .. " examples/embed_host.c " .. flags .. sanitized .. " 2>&1")
    local out = sh("cd " .. q(tmp) .. " && ./embed_host 2>&1")
    assert.truthy(out:find("embed_host: all checks passed", 1, true), out)
  end)

  it("docs/embedding.md shows the link line", function()
    local page = assert(io.open("docs/embedding.md")):read("a")
    assert.truthy(page:find("cc host.c $(pkg-config --cflags --libs moongrad)", 1, true))
  end)
end)
