-- A C host as a newcomer builds one: `make install`, then the link line of
-- docs/embedding.md, `cc host.c $(pkg-config --cflags --libs --static moongrad)`, on
-- the embedding example (examples/embed_host.c, the one that page shows), and its run;
-- the installed archives hold no LTO bytecode (a host's link re-optimises nothing);
-- and a cross build's sysroot (PKG_CONFIG_SYSROOT_DIR), where every path, Lua's
-- too, comes from the sysroot.
local h = require "helpers"

local function q (s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function sh (cmd)
  local out, code = h.run(cmd)
  assert.equal(0, code, cmd .. ":\n" .. out)
  return out
end

local read = h.read

-- the build under test (build-<you>/moongrad: build-<you>), so install copies it as it is
local build = h.bin:match("^(.*)/[^/]*$") or "build"
local CLEAN_ENV = "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES"
-- pkg-config reads nothing of the machine's environment but what a test sets
local PKG_ENV = "env -u PKG_CONFIG_PATH -u PKG_CONFIG_LIBDIR -u PKG_CONFIG_SYSROOT_DIR"

local function install (args)
  sh(CLEAN_ENV .. " make -s --no-print-directory BUILD=" .. q(build) .. " install " .. args .. " 2>&1")
end

-- a sanitized build under test (make asan) needs its runtime in the host too
local function sanitized ()
  local nm = h.run("nm " .. q(build .. "/libmoongrad.a") .. " 2>/dev/null | grep -c __asan_")
  return (tonumber(nm:match("%d+")) or 0) > 0 and " -fsanitize=address,undefined" or ""
end

-- builds examples/embed_host.c with flags, runs it; returns the link's --trace (the files it read)
local function host (tmp, flags)
  local trace = sh("cc -o " .. q(tmp .. "/embed_host") .. " examples/embed_host.c " .. flags .. sanitized() ..
                   " -Wl,--trace 2>&1")
  local out = sh("cd " .. q(tmp) .. " && ./embed_host 2>&1")
  assert.truthy(out:find("embed_host: all checks passed", 1, true), out)
  return trace
end

local function words (s)
  local t = {}
  for w in s:gmatch("%S+") do t[#t + 1] = w end
  return t
end

describe("a C host through pkg-config", function()
  local tmp
  before_each(function() tmp = sh("mktemp -d"):match("^(%S+)") end)
  after_each(function() os.execute("rm -rf " .. q(tmp)) end)

  it("make install puts moongrad.pc beside the library, and the example links and runs with it", function()
    install("PREFIX=" .. q(tmp .. "/usr"))
    local pcdir = tmp .. "/usr/lib/pkgconfig"
    local pc = read(pcdir .. "/moongrad.pc")
    assert.truthy(pc:find("\nprefix=" .. tmp .. "/usr\n", 1, true), pc)
    -- Lua, zlib and cJSON through their own .pc files, not their paths written out
    assert.truthy(pc:find("\nRequires: lua5.4 zlib libcjson\n", 1, true), pc)
    assert.falsy(pc:find("-I/", 1, true), pc)
    local pkg = PKG_ENV .. " PKG_CONFIG_PATH=" .. q(pcdir) .. " pkg-config"
    assert.equal(sh("sed -n 's/^#define MG_VERSION  *\"moongrad \\(.*\\)\"/\\1/p' include/moongrad.h"),
                 sh(pkg .. " --modversion moongrad"))
    -- docs/embedding.md's line, word for word but for where the .pc file lies; plain
    -- --libs too: the archives are static, so nothing they need is private
    for _, libs in ipairs({"--libs --static", "--libs"}) do
      local flags = sh(pkg .. " --cflags " .. libs .. " moongrad"):gsub("%s+$", "")
      -- what the archives need: OpenMP, oneDNN, OpenBLAS' OpenMP build found at run time, Lua
      for _, want in ipairs({"-I" .. tmp .. "/usr/include", "-L" .. tmp .. "/usr/lib", "-lmoongrad_lua",
                             "-lmoongrad", "-lgomp", "-ldnnl", "-lopenblas", "-Wl,-rpath,", "-llua5.4",
                             "-lcjson", "-lz", "-lm"}) do
        assert.truthy(flags:find(want, 1, true), want .. " in " .. flags)
      end
      host(tmp, flags)
    end
  end)

  it("the installed archives hold machine code and no LTO bytecode", function()
    install("PREFIX=" .. q(tmp .. "/usr"))
    for lib, sym in pairs({libmoongrad = "mg_matmul", libmoongrad_lua = "luaopen_moongrad"}) do
      local a = tmp .. "/usr/lib/" .. lib .. ".a"
      local sections = sh("readelf -SW " .. q(a))
      assert.truthy(sections:find("%.text"), sections)
      -- GCC's LTO sections (.gnu.lto_.*, .gnu.debuglto_.*): a host's link would
      -- hand them to the linker plugin, which re-optimises the whole library
      assert.falsy(sections:find("lto_", 1, true), lib .. ": " .. sections)
      local defined = sh("nm -g --defined-only " .. q(a))
      assert.truthy(defined:find(" T " .. sym .. "\n", 1, true), sym)
      -- LTO's partitions share symbols by global names; the install makes them local
      assert.falsy(defined:find("lto_priv", 1, true), lib)
    end
  end)

  it("under PKG_CONFIG_SYSROOT_DIR every path is the sysroot's, Lua's from the sysroot's lua5.4.pc", function()
    -- a sysroot as a cross build has one: moongrad installed into it (DESTDIR),
    -- Lua, zlib and cJSON with their .pc files, headers and libraries (here the
    -- machine's own, linked in); Lua's headers where the build machine has none
    local S = tmp .. "/sysroot"
    install("DESTDIR=" .. q(S) .. " PREFIX=/usr")
    local pkg = PKG_ENV .. " pkg-config"
    local syslib = sh(pkg .. " --variable=libdir lua5.4"):gsub("%s+$", "")
    local sysinc = sh(pkg .. " --variable=includedir lua5.4"):gsub("%s+$", "")
    local luainc = sh(pkg .. " --cflags-only-I lua5.4"):match("%-I(%S+)")
    assert.truthy(luainc, "lua5.4.pc gives no -I")
    local openblas = sh(CLEAN_ENV .. " make -s --no-print-directory --eval 'mg-p: ; @echo $(OPENBLAS_DIR)' mg-p")
                       :gsub("%s+$", "")
    local pcdir = S .. syslib .. "/pkgconfig"
    sh("mkdir -p " .. q(pcdir) .. " " .. q(S .. sysinc .. "/lua-sysroot") .. " " .. q(S .. openblas))
    sh("ln -s " .. q(luainc) .. "/*.h " .. q(S .. sysinc .. "/lua-sysroot"))
    sh("ln -s " .. q(sysinc .. "/cjson") .. " " .. q(S .. sysinc .. "/cjson"))
    for _, p in ipairs({"lua5.4", "zlib", "libcjson"}) do
      local src = sh(pkg .. " --variable=pcfiledir " .. p):gsub("%s+$", "") .. "/" .. p .. ".pc"
      sh("cp " .. q(src) .. " " .. q(pcdir))
    end
    sh("sed -i 's|^lib_name_include=.*|lib_name_include=lua-sysroot|' " .. q(pcdir .. "/lua5.4.pc"))
    for _, so in ipairs({"liblua5.4.so", "libz.so", "libcjson.so"}) do
      sh("ln -s " .. q(syslib .. "/" .. so) .. " " .. q(S .. syslib .. "/" .. so))
    end
    sh("ln -s " .. q(openblas .. "/libopenblas.so") .. " " .. q(S .. openblas .. "/libopenblas.so"))

    local env = PKG_ENV .. " PKG_CONFIG_SYSROOT_DIR=" .. q(S) .. " PKG_CONFIG_LIBDIR=" ..
                q(S .. "/usr/lib/pkgconfig:" .. pcdir) .. " pkg-config"
    local flags = sh(env .. " --cflags --libs --static moongrad"):gsub("%s+$", "")
    local n = 0
    for _, w in ipairs(words(flags)) do
      local path = w:match("^%-[IL](.*)")
      if path then
        n = n + 1
        assert.equal(S .. "/", path:sub(1, #S + 1), w .. " in " .. flags)
      end
    end
    assert.is_true(n >= 4, flags)
    for _, want in ipairs({"-I" .. S .. "/usr/include", "-I" .. S .. sysinc .. "/lua-sysroot",
                           "-L" .. S .. "/usr/lib", "-L" .. S .. openblas,
                           -- where the target finds OpenBLAS at run time: outside the sysroot
                           "-Wl,-rpath," .. openblas}) do
      assert.truthy((" " .. flags .. " "):find(" " .. want .. " ", 1, true), want .. " in " .. flags)
    end
    local trace = host(tmp, flags)
    for _, file in ipairs({S .. "/usr/lib/libmoongrad.a", S .. "/usr/lib/libmoongrad_lua.a",
                           S .. syslib .. "/liblua5.4.so"}) do
      assert.truthy(trace:find(file, 1, true), file .. " in the link's trace:\n" .. trace)
    end

    -- a sysroot without Lua: pkg-config says so, where a path written out
    -- into moongrad.pc had the compiler miss lua.h
    sh("rm " .. q(pcdir .. "/lua5.4.pc"))
    local out, code = h.run(env .. " --cflags --libs --static moongrad 2>&1")
    assert.not_equal(0, code, out)
    assert.truthy(out:find("Package 'lua5.4', required by 'moongrad', not found", 1, true), out)
  end)

  it("docs/embedding.md shows the link line", function()
    local page = read("docs/embedding.md")
    assert.truthy(page:find("cc host.c $(pkg-config --cflags --libs --static moongrad)", 1, true))
    assert.truthy(page:find("PKG_CONFIG_SYSROOT_DIR", 1, true))
  end)
end)
