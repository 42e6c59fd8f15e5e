# moongrad — build, test, demo.
#
#   make demo    build and run the seed example (installs missing Debian packages)
#   make test    build and run every test        (installs missing Debian packages)
#   make asan    the specs again under AddressSanitizer + UBSan
#   make fuzz    random Lua programs, then libFuzzer on every parser (spec/fuzz/)
#   make bench   benchmarks side by side with PyTorch
#
# Override any of these on the command line: make MARCH= OPT=-O2 LTO=
# (GCC: clang before 15 has no _Float16 on x86-64, and before 18 makes no fat LTO objects)

CC       ?= cc
LUA      ?= lua5.4
LUA_INC  ?= /usr/include/lua5.4
LUA_LIB  ?= -llua5.4
MARCH    ?= -march=native
OPT      ?= -O3
MYCFLAGS ?=
# link-time optimisation: the core's small functions (a tensor's retain, a
# dtype's size, the tape's checks) inline across files into each op's path.
# Fat objects: build/libmoongrad.a links into C hosts without LTO too (make LTO=
# for none); the archives make install puts hold no LTO bytecode (see install)
LTO      ?= -flto=auto -ffat-lto-objects
PREFIX   ?= /usr/local
BUILD    ?= build

WARN = -Wall -Wextra \
       -Wshadow \
       -Wmissing-prototypes \
       -Wstrict-prototypes \
       -Wwrite-strings \
       -Wundef
#      -Wconversion          (noisy: every size_t <-> int64_t)
#      -Wcast-qual

# -fno-math-errno: nothing reads errno, and it lets loops call libmvec (src/ops/vecmath.h)
# -ffp-contract=off: a fused loop (dense's bias and activation, the optimizers'
# one-pass steps) gives the numbers of the separate ops only without FMA
# contraction, which clang does by default (GCC not under -std=c11)
# -fno-plt: each op calls Lua's API a dozen times, each call then one jump
# through the GOT instead of two (the seed chain: 2-3% faster)
# (not -fno-semantic-interposition: moongrad.so loaded into the moongrad binary,
# which exports its symbols, must call the binary's copies: one library state;
# with it, make asan mixed two copies and read freed memory)
CFLAGS  = -std=c11 -D_POSIX_C_SOURCE=200809L $(OPT) $(MARCH) -fno-math-errno -ffp-contract=off -fPIC -fno-plt -fopenmp \
          -Iinclude -Isrc -I$(LUA_INC) $(WARN) $(MYCFLAGS)
# CFLAGS += -DMG_ASSERT_ON      (internal invariants)
# OpenBLAS' OpenMP build, by path: it shares the OpenMP threads with oneDNN
# and ours (the default alternative, its pthread build, has a pool of its own)
OPENBLAS_DIR = /usr/lib/x86_64-linux-gnu/openblas-openmp
BASE_LIBS = -ldnnl -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas -lcjson -lz -lmvec -lm
LIBS    = $(BASE_LIBS) -fopenmp
# what a C host links with the archives (moongrad.pc, make install): Lua, zlib
# and cJSON in Requires, so pkg-config takes their flags from their own .pc
# files (a sysroot's under PKG_CONFIG_SYSROOT_DIR), the rest written out in
# Libs: -lgomp and not -fopenmp, which means something else to clang (libomp).
# LUA_PC= for a Lua without a .pc file: LUA_INC and LUA_LIB written out instead
LUA_PC  ?= lua5.4
PC_REQUIRES = $(LUA_PC) zlib libcjson
PC_CFLAGS   = $(if $(LUA_PC),,-I$(LUA_INC))
PC_LIBS     = $(if $(LUA_PC),,$(LUA_LIB)) $(filter-out -lcjson -lz,$(BASE_LIBS)) -lgomp -lpthread
VERSION = $(shell sed -n 's/^#define MG_VERSION  *"moongrad \(.*\)"/\1/p' include/moongrad.h)

# Debian packages the build and the tests need
DEPS = lua5.4 liblua5.4-dev lua-busted libreadline-dev libdnnl-dev libopenblas-openmp-dev libcjson-dev \
       libdlpack-dev zlib1g-dev gnuplot-nox tmux luarocks pkg-config libopenmpi-dev openmpi-bin \
       libzmq3-dev libssl-dev
# what the libFuzzer harnesses need (make fuzz, make fuzz-parsers): clang and its
# runtimes (libclang-rt-dev: libFuzzer, ASan, UBSan); the library itself stays on GCC
FUZZ_DEPS = clang libclang-rt-dev
# what the notebook specs need besides (spec/37-kernel_spec.lua): make notebook-deps,
# which .ci/run calls; make test skips those specs, saying so, when they are missing
NOTEBOOK_DEPS = python3-jupyter-client python3-nbclient python3-ipykernel jupyter-nbconvert chromium

# The sources follow the folders, one floor each (docs/design.md):
# core <- ops <- autodiff <- io, dist <- the Lua binding <- cli, kernel.
# libmoongrad.a: the library a C host links, without Lua
LIB_SRC  = $(wildcard src/core/*.c src/ops/*.c src/autodiff/*.c src/io/*.c)
# libmoongrad_lua.a: the Lua binding and the embedded Lua modules (luaopen_moongrad)
BIND_SRC = $(wildcard src/lua/*.c)
# the moongrad binary's own: the interpreter and the REPL's completion
CLI_SRC  = $(wildcard src/cli/*.c)
# the Jupyter kernel (moongrad --kernel), with its Lua half: ZeroMQ and
# OpenSSL's HMAC, in the binary only
KERNEL_SRC = $(wildcard src/kernel/*.c)
KERNEL_LIBS = -lzmq -lcrypto -lpthread
# mg.distributed on Open MPI, with its Lua half: compiled into the binary and
# moongrad.so, never into the archives (their C hosts need no MPI); left out
# when mpicc is missing
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
ifneq ($(strip $(MPI_LIBS)),)
DIST_SRC = $(wildcard src/dist/*.c)
MAIN_DEFS = -DMG_HAVE_MPI
endif
obj_of = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(1))
LIB_OBJ    = $(call obj_of,$(LIB_SRC))
BIND_OBJ   = $(call obj_of,$(BIND_SRC)) $(BUILD)/obj/embedded.o
CLI_OBJ    = $(call obj_of,$(CLI_SRC))
KERNEL_OBJ = $(call obj_of,$(KERNEL_SRC))
DIST_OBJ   = $(call obj_of,$(DIST_SRC))
LUA_MODS = $(wildcard lua/moongrad/*.lua)
HEADERS = $(wildcard include/*.h src/*/*.h)

.PHONY: all deps notebook-deps fuzz-deps install-kernel test demo asan asan-build tsan fuzz fuzz-opt fuzz-build fuzz-parsers \
        run-c-tests bench install clean check sz api-table

all: $(BUILD)/moongrad $(BUILD)/moongrad.so $(BUILD)/libmoongrad.a $(BUILD)/libmoongrad_lua.a

$(BUILD)/obj/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LTO) -c $< -o $@

$(BUILD)/embedded.c: src/lua/embed.lua $(LUA_MODS)
	@mkdir -p $(BUILD)
	$(LUA) src/lua/embed.lua $@ $(LUA_MODS)

$(BUILD)/obj/dist/%.o: CFLAGS += $(MPI_CFLAGS)

$(BUILD)/obj/embedded.o: $(BUILD)/embedded.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LTO) -Isrc/lua -c $< -o $@

$(BUILD)/libmoongrad.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/libmoongrad_lua.a: $(BIND_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/moongrad.so: $(BIND_OBJ) $(DIST_OBJ) $(LIB_OBJ)
	$(CC) $(CFLAGS) $(LTO) -shared -o $@ $^ $(LIBS) $(MPI_LIBS)

$(BUILD)/moongrad: $(CLI_OBJ) $(DIST_OBJ) $(KERNEL_OBJ) $(BUILD)/libmoongrad_lua.a $(BUILD)/libmoongrad.a
	$(CC) $(CFLAGS) $(LTO) -o $@ $^ $(LUA_LIB) -lreadline $(LIBS) $(MPI_LIBS) $(KERNEL_LIBS) -Wl,-E

$(BUILD)/obj/cli/main.o: CFLAGS += -DMG_USE_READLINE $(MAIN_DEFS)

# C programs on the public API: a host embedding Lua (examples/embed_host.c),
# recompute and a checkpointed loop from C alone (examples/recompute_host.c,
# loop_host.c), bad C arguments, threads
# and files (spec/)
C_TESTS = $(BUILD)/embed_host $(BUILD)/recompute_host $(BUILD)/c_api_test $(BUILD)/threads_test \
          $(BUILD)/io_test $(BUILD)/loop_host $(BUILD)/binding_states_test
# the fuzz harnesses of spec/fuzz/harness/ built by $(CC) with a main of their
# own (replay.c), which runs each on its seeds and reproducers: a regression test
# without clang (make fuzz fuzzes them; see there)
FUZZ_NAMES = safetensors idx csv wire
FUZZ_REPLAY = $(patsubst %,$(BUILD)/fuzz_replay_%,$(FUZZ_NAMES))

# A C host links libmoongrad.a alone, without Lua (recompute_host, loop_host,
# io_test show it); one that embeds Lua adds the binding's archive first
HOST_LIBS = $(BUILD)/libmoongrad.a
$(BUILD)/embed_host $(BUILD)/c_api_test $(BUILD)/threads_test $(BUILD)/binding_states_test: \
  HOST_LIBS = $(BUILD)/libmoongrad_lua.a $(BUILD)/libmoongrad.a $(LUA_LIB)

$(BUILD)/%: examples/%.c $(BUILD)/libmoongrad_lua.a $(BUILD)/libmoongrad.a
	$(CC) $(CFLAGS) -o $@ $< $(HOST_LIBS) $(LIBS)

$(BUILD)/%: spec/%.c $(BUILD)/libmoongrad_lua.a $(BUILD)/libmoongrad.a
	$(CC) $(CFLAGS) -o $@ $< $(HOST_LIBS) $(LIBS) -lpthread

$(BUILD)/fuzz_replay_%: spec/fuzz/harness/fuzz_%.c spec/fuzz/harness/replay.c spec/fuzz/harness/harness.h \
                        $(BUILD)/obj/kernel/wire.o $(BUILD)/libmoongrad.a
	$(CC) $(CFLAGS) -o $@ spec/fuzz/harness/replay.c $< $(BUILD)/obj/kernel/wire.o $(BUILD)/libmoongrad.a \
	  $(LIBS) $(KERNEL_LIBS)

run-c-tests: $(C_TESTS) $(FUZZ_REPLAY)
	@for t in $(C_TESTS); do $$t || exit 1; done
	@for n in $(FUZZ_NAMES); do \
	  $(BUILD)/fuzz_replay_$$n spec/fuzz/harness/corpus/$$n spec/fuzz/harness/repro/$$n || exit 1; done

# installs what is missing, and nothing when all is there; as root directly,
# otherwise through sudo (env after sudo: sudo resets the environment).
# bench/run.sh reuses it: make deps DEPS="..."
deps:
	@missing=""; for p in $(DEPS); do \
	  dpkg -s $$p 2>/dev/null | grep -q '^Status: install ok installed' || missing="$$missing $$p"; \
	done; \
	[ -z "$$missing" ] && exit 0; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make deps: missing:$$missing; there is no apt-get here (not Debian?): install them by hand" >&2; exit 1; \
	elif [ "$$(id -u)" = 0 ]; then as_root=""; \
	elif command -v sudo >/dev/null 2>&1; then as_root="sudo"; \
	else echo "make deps: missing Debian packages:$$missing" >&2; \
	  echo "make deps: not root and no sudo; as root, run: apt-get install$$missing" >&2; exit 1; fi; \
	echo "make deps: installing Debian packages$${as_root:+ (through sudo)}:$$missing"; \
	apt="$$as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300"; \
	$$apt update -qq && $$apt install -y -qq --no-install-recommends $$missing || \
	{ echo "make deps: apt-get failed; could not install:$$missing" >&2; exit 1; }

# the notebook specs' packages (Jupyter's client, nbconvert, headless Chromium)
notebook-deps:
	@$(MAKE) -s deps DEPS="$(NOTEBOOK_DEPS)"

# clang and libFuzzer for the parser harnesses
fuzz-deps:
	@$(MAKE) -s deps DEPS="$(FUZZ_DEPS)"

# the kernelspec, so that jupyter notebook / jupyter lab list moongrad;
# KERNEL_FLAGS= for a system-wide one (/usr/local/share/jupyter/kernels)
KERNEL_FLAGS ?= --user
install-kernel: $(BUILD)/moongrad
	$(BUILD)/moongrad --install-kernel $(KERNEL_FLAGS)

check: run-c-tests

# each spec file in a process of its own (spec/run-each says why); SPECS= runs
# some: make test SPECS=spec/20-saved_hooks_spec.lua
test: deps
	$(MAKE) all
	$(MAKE) run-c-tests
	spec/run-each $(LUA) $(SPECS)

demo: deps
	$(MAKE) all
	$(BUILD)/moongrad examples/seed_recompute.lua

# AddressSanitizer + UBSan: the interpreter is built instrumented and runs
# busted itself; the C programs run instrumented too
ASAN_MAKE = $(MAKE) BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" LTO= \
  MYCFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
  LIBS="$(BASE_LIBS) -fopenmp -fsanitize=address,undefined"
export ASAN_OPTIONS ?= allocator_may_return_null=1:detect_leaks=1

asan-build: deps
	$(ASAN_MAKE) build-asan/moongrad

asan: asan-build
	$(ASAN_MAKE) run-c-tests
	MOONGRAD_BIN=build-asan/moongrad spec/run-each build-asan/moongrad $(SPECS)

# ThreadSanitizer: two Lua states on two threads (spec/threads_test.c). One
# OpenMP thread each: libgomp is not instrumented, and would be all noise.
tsan: deps
	$(MAKE) BUILD=build-tsan OPT="-O1 -g" LTO= MYCFLAGS="-fsanitize=thread" \
	  LIBS="$(BASE_LIBS) -fopenmp -fsanitize=thread" build-tsan/threads_test
	OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 build-tsan/threads_test

# random programs over the whole API under the sanitizers (spec/fuzz/):
# FUZZ_SECONDS=600 by default, FUZZ_SEED= to replay a run;
# the fuzzer's minimal reproducers (each once a crash or a wrong result), then fuzzing;
# then the parsers' libFuzzer harnesses (fuzz-parsers), and what they kept run
# once more through the whole library under GCC's ASan + UBSan (in the harnesses
# only the parsers are instrumented)
fuzz: asan-build fuzz-build
	$(ASAN_MAKE) $(patsubst %,build-asan/fuzz_replay_%,$(FUZZ_NAMES))
	bash spec/fuzz/repro.sh
	bash spec/fuzz/harness/run.sh --replay
	bash spec/fuzz/run.sh
	bash spec/fuzz/harness/run.sh
	@for n in $(FUZZ_NAMES); do build-asan/fuzz_replay_$$n $(FUZZ_BUILD)/corpus/$$n || exit 1; done

# the same random programs on the optimised build (some bugs show only there):
# -O3, LTO, built for x86-64-v3 (AVX2, which valgrind runs; oneDNN and OpenBLAS
# pick their AVX2 kernels under it), each program under valgrind's memcheck,
# its address space capped (spec/fuzz/check.sh); FUZZ_SECONDS as make fuzz
VALGRIND = valgrind -q --error-exitcode=25 --fullpath-after=
fuzz-opt: deps
	@$(MAKE) -s deps DEPS=valgrind
	$(MAKE) BUILD=build-v3 MARCH=-march=x86-64-v3 build-v3/moongrad
	FUZZ_BIN=build-v3/moongrad FUZZ_OUT=build-v3/fuzz-findings FUZZ_WRAP="$(VALGRIND)" \
	  FUZZ_TIMEOUT=$${FUZZ_TIMEOUT:-120} bash spec/fuzz/run.sh

# libFuzzer harnesses (spec/fuzz/harness/) for the safetensors, IDX and CSV
# readers and the kernel's wire format: each harness and the parser sources it
# calls (src/io/*.c, src/kernel/wire.c) compiled by clang with coverage, ASan
# and UBSan; the rest of the library by GCC into $(FUZZ_BUILD)/ (uninstrumented:
# clang 14 has no _Float16). FUZZ_HARNESS_SECONDS a harness (default: FUZZ_SECONDS,
# else 600); reproducers in spec/fuzz/harness/repro/ run first
FUZZ_CC     ?= clang
FUZZ_BUILD  ?= build-fuzz
FUZZ_CFLAGS  = -std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fno-omit-frame-pointer \
               -fsanitize=address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc $(WARN)
FUZZ_PARSERS = $(patsubst src/%.c,$(FUZZ_BUILD)/parsers/%.o,$(wildcard src/io/*.c) src/kernel/wire.c)
FUZZ_BINS    = $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_NAMES))

$(FUZZ_BUILD)/parsers/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

# the parsers' objects come first: the library's own copies of them are never linked
$(FUZZ_BUILD)/fuzz_%: spec/fuzz/harness/fuzz_%.c spec/fuzz/harness/harness.h $(FUZZ_PARSERS) $(FUZZ_BUILD)/libmoongrad.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_PARSERS) $(FUZZ_BUILD)/libmoongrad.a \
	  $(BASE_LIBS) -lgomp $(KERNEL_LIBS)

fuzz-build: deps fuzz-deps
	$(MAKE) BUILD=$(FUZZ_BUILD) OPT="-O1 -g" LTO= $(FUZZ_BUILD)/libmoongrad.a
	$(MAKE) $(FUZZ_BINS)

fuzz-parsers: fuzz-build
	bash spec/fuzz/harness/run.sh --replay
	bash spec/fuzz/harness/run.sh

bench: deps
	$(MAKE) all
	bash bench/run.sh

# The archives make install puts (docs/embedding.md): each archive's objects
# linked into one relocatable object (-r), its LTO done here, once, across its
# files as in the moongrad binary, and no LTO bytecode left in it. A host's link
# then copies machine code (a second) where the fat objects of build/ had GCC's
# linker plugin re-optimise the whole library in every host's link (tens of
# seconds), -flto or not. --localize-hidden: the symbols LTO made global between
# its partitions (foo.lto_priv.0) are local again, so the two archives' never
# clash. -fopenmp stays out of the -r link, which would copy libgomp.a in.
$(BUILD)/install/libmoongrad.a: $(LIB_OBJ)
$(BUILD)/install/libmoongrad_lua.a: $(BIND_OBJ)
$(BUILD)/install/%.a:
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -fopenmp,$(CFLAGS)) $(LTO) $(if $(LTO),-flinker-output=nolto-rel) -r -nostdlib \
	  -o $(@:.a=.o) $^
	objcopy --localize-hidden $(@:.a=.o)
	rm -f $@
	ar rcs $@ $(@:.a=.o)

install: all $(BUILD)/install/libmoongrad.a $(BUILD)/install/libmoongrad_lua.a
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/lua/5.4 $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib
	install -m 755 $(BUILD)/moongrad $(DESTDIR)$(PREFIX)/bin/moongrad
	install -m 644 $(BUILD)/moongrad.so $(DESTDIR)$(PREFIX)/lib/lua/5.4/moongrad.so
	install -m 644 $(BUILD)/install/libmoongrad.a $(DESTDIR)$(PREFIX)/lib/libmoongrad.a
	install -m 644 $(BUILD)/install/libmoongrad_lua.a $(DESTDIR)$(PREFIX)/lib/libmoongrad_lua.a
	install -m 644 include/moongrad.h $(DESTDIR)$(PREFIX)/include/moongrad.h
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@REQUIRES@|$(strip $(PC_REQUIRES))|' \
	  -e 's|@CFLAGS@|$(PC_CFLAGS)|' -e 's|@LIBS@|$(strip $(PC_LIBS))|' \
	  moongrad.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/moongrad.pc
	chmod 644 $(DESTDIR)$(PREFIX)/lib/pkgconfig/moongrad.pc

# the API table of docs/reference.md, written from lua/moongrad/help.lua (spec/33 checks they agree)
api-table: $(BUILD)/moongrad
	$(BUILD)/moongrad lua/api_table.lua docs/reference.md

# lines per file, as tinygrad's sz.py
sz:
	@wc -l include/*.h src/*/*.c src/*/*.h lua/moongrad/*.lua | sort -n

clean:
	rm -rf build build-asan build-tsan $(FUZZ_BUILD)
