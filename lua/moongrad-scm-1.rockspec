-- LuaRocks: the module for stock lua5.4, built by the project's Makefile. From the
-- project root (a checkout; there is no source archive to fetch):
--
--   luarocks --lua-version=5.4 make lua/moongrad-scm-1.rockspec
--
-- (--local or --tree=DIR to install somewhere else than /usr/local). `luarocks make`
-- builds in the current directory whatever folder the rockspec is in, so it lives
-- here, in lua/, and the top level stays as it is. The build goes to build/rock/ (its
-- own objects: LuaRocks' CC and CFLAGS are not the plain `make`'s), and only
-- moongrad.so is installed: nn, optim, test and progress are compiled into it, and
-- it needs libdnnl (Debian: libdnnl-dev), OpenBLAS' OpenMP build (libopenblas-openmp-dev),
-- libmvec and OpenMP at run time.
rockspec_format = "3.0"
package = "moongrad"
version = "scm-1"

source = {
  url = "git+file://.",   -- unused by `luarocks make`; no public repository yet
}

description = {
  summary = "Tensors with tape autodiff and memory-aware training (recompute_grad)",
  detailed = [[
An eager tensor library with tape-based automatic differentiation, written in C11:
gradient checkpointing (recompute_grad), reversible blocks and a counting allocator
that measures what the tape holds. require "moongrad" (also moongrad.nn,
moongrad.optim, moongrad.test, moongrad.progress).]],
  labels = {"tensor", "autodiff", "machine-learning"},
}

dependencies = {
  "lua >= 5.4, < 5.5",
}

-- only checked (a missing oneDNN is named before the build starts): the Makefile
-- takes it from the system paths
external_dependencies = {
  DNNL = {header = "dnnl.h", library = "dnnl"},
}

build = {
  type = "make",
  build_target = "build/rock/moongrad.so",
  build_variables = {
    BUILD = "build/rock",
    LUA = "$(LUA)",
    LUA_INC = "$(LUA_INCDIR)",
    -- LuaRocks' CFLAGS (Debian: "-O2 -fPIC") go in, but -O3 stays last: at -O2 GCC does
    -- not vectorize the elementwise loops through libmvec (exp, tanh: 7x slower)
    OPT = "$(CFLAGS) -O3",
  },
  install_pass = false,   -- `make install` installs the interpreter and C library too
  install = {
    lib = {moongrad = "build/rock/moongrad.so"},
  },
}
