/*
** c_api_test.c — bad arguments through the C API are errors with a
** message naming the function and the argument, never crashes; and a
** C-owned tape outlives the Lua state that recorded Lua callbacks on it.
**
**   make build/c_api_test && build/c_api_test      (make test runs it)
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include <dlpack/dlpack.h>

#include "moongrad.h"

static int failures = 0, checks = 0;

/* the last failure's message must contain `want` */
static void says (const char *what, int failed, const char *want) {
  checks++;
  if (!failed) {
    fprintf(stderr, "c_api_test: %s: did not fail\n", what);
    failures++;
  } else if (strstr(mg_errmsg(), want) == NULL) {
    fprintf(stderr, "c_api_test: %s: message \"%s\" lacks \"%s\"\n", what, mg_errmsg(), want);
    failures++;
  }
}

static void null_arguments (void) {
  int64_t s2[1] = {2};
  mg_tensor *x = mg_full(s2, 1, MG_FLOAT32, 1.0);
  says("ndim(NULL)", mg_tensor_ndim(NULL) == -1, "mg_tensor_ndim: argument 't' is NULL");
  says("shape(NULL)", mg_tensor_shape(NULL) == NULL, "mg_tensor_shape");
  says("numel(NULL)", mg_tensor_numel(NULL) == -1, "mg_tensor_numel");
  says("data(NULL)", mg_tensor_data(NULL) == NULL, "mg_tensor_data");
  says("full(NULL, 2)", mg_full(NULL, 2, MG_FLOAT32, 0) == NULL, "argument 'shape' is NULL");
  says("full bad dtype", mg_full(s2, 1, (mg_dtype)42, 0) == NULL, "unknown dtype 42");
  says("add(NULL, x)", mg_add(NULL, x) == NULL, "mg_add: argument 'a' is NULL");
  says("exp(NULL)", mg_exp(NULL) == NULL, "mg_exp: argument 'x' is NULL");
  says("sum(NULL)", mg_sum(NULL, MG_ALL_AXES, 0) == NULL, "mg_sum: argument 'x' is NULL");
  says("matmul(x, NULL)", mg_matmul(x, NULL) == NULL, "mg_matmul: argument 'b' is NULL");
  says("dense(NULL, x)", mg_dense(NULL, x, NULL, "relu") == NULL, "mg_dense: argument 'x' is NULL");
  says("dense(x, x)", mg_dense(x, x, NULL, NULL) == NULL, "dense: w must be a matrix (in, out), got shape (2)");
  int64_t s22[2] = {2, 2};
  mg_tensor *w = mg_full(s22, 2, MG_FLOAT32, 0.5);
  says("dense gelu", mg_dense(x, w, NULL, "gelu") == NULL, "dense: unknown activation 'gelu'");
  mg_tensor *d = mg_dense(x, w, x, "tanh");                 /* tanh(1 * 0.5 * 2 + 1) = tanh(2) */
  checks++;
  if (d == NULL || mg_tensor_numel(d) != 2 || ((const float *)mg_tensor_data(d))[1] != tanhf(2.0f)) {
    fprintf(stderr, "c_api_test: dense(x, w, x, tanh): wrong result\n");
    failures++;
  }
  mg_tensor_release(d);
  mg_tensor_release(w);
  /* conv2d with its activation in the op: a 1x1 filter of -1 on an image of ones, relu'd */
  int64_t img[4] = {1, 2, 2, 1}, f11[4] = {1, 1, 1, 1};
  mg_tensor *im = mg_full(img, 4, MG_FLOAT32, 1.0), *k = mg_full(f11, 4, MG_FLOAT32, -1.0);
  mg_conv_params cp = {0};
  says("conv2d gelu", mg_conv2d_act(im, k, NULL, &cp, "gelu") == NULL, "conv2d: unknown activation 'gelu'");
  says("conv2d_act(NULL)", mg_conv2d_act(NULL, k, NULL, &cp, "relu") == NULL, "mg_conv2d: argument 'x' is NULL");
  mg_tensor *c = mg_conv2d_act(im, k, NULL, &cp, "relu"), *c0 = mg_conv2d_act(im, k, NULL, &cp, NULL);
  checks++;
  if (c == NULL || c0 == NULL || ((const float *)mg_tensor_data(c))[3] != 0.0f ||
      ((const float *)mg_tensor_data(c0))[3] != -1.0f) {
    fprintf(stderr, "c_api_test: conv2d_act relu / linear: wrong result\n");
    failures++;
  }
  mg_tensor_release(c);
  mg_tensor_release(c0);
  mg_tensor_release(im);
  mg_tensor_release(k);
  says("reshape(x, NULL, 1)", mg_reshape(x, NULL, 1) == NULL, "mg_reshape: argument 'shape_in' is NULL");
  says("reshape 99 dims", mg_reshape(x, s2, 99) == NULL, "99 dimensions");
  says("concat(NULL)", mg_concat(NULL, 2, 0) == NULL, "mg_concat: argument 'xs' is NULL");
  mg_tensor *two[2] = {x, NULL};
  says("concat with NULL", mg_concat(two, 2, 0) == NULL, "mg_concat");
  says("permute(x, NULL)", mg_permute(x, NULL) == NULL, "mg_permute: argument 'perm' is NULL");
  says("where(NULL..)", mg_where(NULL, x, x) == NULL, "mg_where: argument 'cond' is NULL");
  says("sum_to_shape NULL", mg_sum_to_shape(x, NULL, 1) == NULL, "argument 'shape' is NULL");
  says("variable_new(NULL)", mg_variable_new(NULL, "v", 1) == NULL, "mg_variable_new");
  says("variable_read(NULL)", mg_variable_read(NULL) == NULL, "mg_variable_read");
  says("assign(NULL)", mg_variable_assign(NULL, x) == MG_ERR, "mg_variable_assign");
  mg_tensor *mo = x, *so = x;
  says("adam(NULL)", mg_variable_adam(NULL, x, NULL, NULL, NULL, &mo, &so) == MG_ERR && mo == NULL && so == NULL,
       "mg_variable_adam: argument 'v' is NULL");
  mg_tensor *bo = x;
  says("momentum(NULL)", mg_variable_momentum(NULL, x, NULL, 0.9, 0.1, 0, &bo) == MG_ERR && bo == NULL,
       "mg_variable_momentum: argument 'v' is NULL");
  mg_tensor *slots[3] = {NULL, NULL, NULL}, *rout[3] = {x, x, x};
  mg_rmsprop_params rp = {0.1, 0.9, 1e-7, 0, 0};
  says("rmsprop(NULL)", mg_variable_rmsprop(NULL, x, slots, &rp, rout) == MG_ERR && rout[0] == NULL,
       "mg_variable_rmsprop: argument 'v' is NULL");
  mg_tensor *grad = x;
  says("tape_gradient(NULL)", mg_tape_gradient(NULL, 1, &x, 1, &x, NULL, 0, &grad) == MG_ERR && grad == NULL,
       "mg_tape_gradient: argument 't' is NULL");
  says("tape_watch(NULL)", mg_tape_watch(NULL, x) == MG_ERR, "mg_tape_watch");
  says("tape_reset(NULL)", mg_tape_reset(NULL) == MG_ERR, "mg_tape_reset");
  mg_tensor *out = x;
  says("jacobian(NULL)", mg_tape_jacobian(NULL, x, x, 0, &out) == MG_ERR && out == NULL,
       "mg_tape_jacobian");
  mg_tensor *outs[2] = {x, x}, *srcs[2] = {x, NULL};
  says("jacobians(NULL)", mg_tape_jacobians(NULL, x, 2, srcs, 0, outs) == MG_ERR && outs[0] == NULL
       && outs[1] == NULL, "mg_tape_jacobians: argument 't' is NULL");
  says("jacobians(-1)", mg_tape_jacobians(NULL, x, -1, srcs, 0, outs) == MG_ERR,
       "mg_tape_jacobians: the count of sources is negative (-1)");
  mg_tape *tp = mg_tape_new(0, 1);
  says("jacobians(sources[1] NULL)", mg_tape_jacobians(tp, x, 2, srcs, 0, outs) == MG_ERR,
       "mg_tape_jacobians: sources[1] is NULL");
  mg_tape_release(tp);
  says("custom_call(NULL)", mg_custom_call(NULL, NULL, 0, NULL, NULL) == MG_ERR, "mg_custom_call");
  says("list_push(NULL)", mg_list_push(NULL, mg_tensor_retain(x)) == MG_ERR, "mg_list_push");
  /* a chain keeps the failure that started it */
  int64_t s3[1] = {3};
  mg_tensor *y = mg_full(s3, 1, MG_FLOAT32, 1.0);
  mg_tensor *r = mg_exp(mg_add(x, y));
  says("exp(add(bad))", r == NULL, "shapes do not broadcast");
  mg_tensor_release(y);
  mg_tensor_release(x);
}

static void out_of_range (void) {
  int64_t s23[2] = {2, 3};
  mg_tensor *x = mg_full(s23, 2, MG_FLOAT64, 1.0);
  int64_t bad[2] = {1, 3}, neg[2] = {-1, 0};
  says("get past the end", isnan(mg_tensor_get(x, bad)), "index[1] = 3 is out of range");
  says("get negative", isnan(mg_tensor_get(x, neg)), "index[0] = -1");
  says("get NULL index", isnan(mg_tensor_get(x, NULL)), "argument 'index' is NULL");
  if (!mg_dtype_is_float(MG_FLOAT64) || !mg_dtype_is_float(MG_BFLOAT16) || mg_dtype_is_float(MG_INT64)
      || mg_dtype_is_float(MG_BOOL) || mg_dtype_is_float((mg_dtype)42)) {
    fprintf(stderr, "c_api_test: mg_dtype_is_float is wrong\n");
    failures++;
  }
  mg_tape *t = mg_tape_new(0, 1);
  says("tape_variable(t, 99)", mg_tape_variable(t, 99) == NULL, "index 99 is out of range");
  says("tape_variable(t, -1)", mg_tape_variable(t, -1) == NULL, "index -1");
  mg_tape_release(t);
  int64_t start[2] = {5, 0}, step[2] = {1, 1}, shape[2] = {2, 3};
  says("unslice past the shape", mg_unslice(x, shape, start, step) == NULL, "does not fit");
  int64_t zero[2] = {1, 0};
  says("unslice step 0", mg_unslice(x, shape, start, zero) == NULL, "does not fit");
  int64_t s0[2] = {0, 0}, stop[2] = {2, 3}, huge[2] = {INT64_MAX, 1};
  mg_tensor *s = mg_slice(x, s0, stop, huge);          /* counts without overflow */
  checks++;
  if (s == NULL || mg_tensor_shape(s)[0] != 1) {
    fprintf(stderr, "c_api_test: slice with a huge step: %s\n", s ? "wrong shape" : mg_errmsg());
    failures++;
  }
  mg_tensor_release(s);
  says("set_num_threads(0)", mg_set_num_threads(0) == MG_ERR, "out of range");
  says("set_num_threads(1000000)", mg_set_num_threads(1000000) == MG_ERR, "out of range");
  mg_tensor_release(x);
}

/* A Lua custom gradient recorded on a tape the host owns, then lua_close:
** the gradient is an error naming the closed state, and releasing the
** tape afterwards touches nothing of it. */
static void tape_outlives_state (void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "moongrad", luaopen_moongrad, 0);
  lua_setglobal(L, "mg");
  int64_t s2[1] = {2};
  mg_tensor *x = mg_full(s2, 1, MG_FLOAT64, 3.0);
  mg_tape *t = mg_tape_new(1, 1);
  mg_tape_watch(t, x);
  mgL_pushtensor(L, mg_tensor_retain(x));
  lua_setglobal(L, "x");
  if (luaL_dostring(L, "f = mg.custom_gradient(function(v) return v * v, function(d) return d * 2 * v end end)\n"
                       "y = f(x)") != LUA_OK) {
    fprintf(stderr, "c_api_test: %s\n", lua_tostring(L, -1));
    failures++;
  }
  lua_getglobal(L, "y");
  mg_tensor *y = mg_tensor_retain(mgL_checktensor(L, -1));
  lua_pop(L, 1);
  mg_tensor *g = NULL;
  checks++;
  if (mg_tape_gradient(t, 1, &y, 1, &x, NULL, 0, &g) != MG_OK) {
    fprintf(stderr, "c_api_test: gradient while the state lives: %s\n", mg_errmsg());
    failures++;
  }
  mg_tensor_release(g);
  lua_close(L);
  says("gradient after lua_close", mg_tape_gradient(t, 1, &y, 1, &x, NULL, 0, &g) == MG_ERR,
       "the Lua state that defined this function has been closed");
  mg_tape_release(t);                                   /* frees the node: no Lua touched */
  mg_tensor_release(y);
  mg_tensor_release(x);
}

static int released = 0;
static void count_release (void *ud) { released += *(int *)ud; }

/* a host's buffer and DLPack: the tensors view the very bytes, and the
** owners hear when the last view goes */
static void exchange (void) {
  double host[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3}, tr[2] = {1, 3};
  int one = 1;
  size_t before = mg_memory_allocated_bytes();
  mg_tensor *x = mg_from_blob(host, shape, 2, NULL, MG_FLOAT64, count_release, &one);
  int64_t s32[2] = {3, 2};
  mg_tensor *xt = mg_from_blob(host, s32, 2, tr, MG_FLOAT64, count_release, &one);   /* a transposed view */
  int64_t i12[2] = {1, 2}, i21[2] = {2, 1};
  checks++;
  if (x == NULL || xt == NULL || mg_tensor_data(x) != (void *)host || mg_tensor_get(x, i12) != 6 ||
      mg_tensor_get(xt, i21) != 6 || mg_memory_allocated_bytes() != before) {
    fprintf(stderr, "c_api_test: from_blob does not view the host's bytes\n");
    failures++;
  }
  struct DLManagedTensor *m = mg_to_dlpack(xt);
  mg_tensor *back = m ? mg_from_dlpack(m) : NULL;      /* takes over m */
  checks++;
  if (back == NULL || mg_tensor_data(back) != mg_tensor_data(xt) || mg_tensor_get(back, i21) != 6 ||
      mg_tensor_strides(back)[1] != 3 || mg_memory_allocated_bytes() != before) {
    fprintf(stderr, "c_api_test: DLPack round trip copied or changed: %s\n", mg_errmsg());
    failures++;
  }
  mg_tensor_release(x);
  mg_tensor_release(xt);                               /* back still holds xt's data */
  checks++;
  if (released != 1) { fprintf(stderr, "c_api_test: released %d times, want 1\n", released); failures++; }
  mg_tensor_release(back);                             /* the deleter releases xt's storage */
  checks++;
  if (released != 2) { fprintf(stderr, "c_api_test: released %d times, want 2\n", released); failures++; }
  int64_t neg[1] = {-1}, s3[1] = {3};
  mg_tensor *rev = mg_from_blob(host + 2, s3, 1, neg, MG_FLOAT64, NULL, NULL);   /* 3, 2, 1 */
  int64_t i0[1] = {0};
  checks++;
  if (rev == NULL || mg_tensor_get(rev, i0) != 3) { fprintf(stderr, "c_api_test: negative strides\n"); failures++; }
  mg_tensor_release(rev);
  says("from_blob NULL data", mg_from_blob(NULL, shape, 2, NULL, MG_FLOAT32, count_release, &one) == NULL &&
       released == 3, "argument 'data' is NULL");
  DLManagedTensor gpu = {.dl_tensor = {.device = {kDLCUDA, 0}, .dtype = {kDLFloat, 32, 1}}};
  says("from_dlpack on a GPU", mg_from_dlpack(&gpu) == NULL, "on device type 2");
}

/* mg_custom_save from C: what the forward saves is the tape's (counted,
** let go with the node), and the backward finds it in a->ctx */
static mg_status saving_forward (void *ud, int nin, mg_tensor *const *in, mg_list *out) {
  (void)ud;
  (void)nin;
  mg_tensor *y = mg_exp(in[0]);
  mg_custom_ctx *c = mg_custom_context();
  if (y == NULL || c == NULL || mg_custom_save(c, 1, &y) != MG_OK) {
    mg_tensor_release(y);
    return MG_ERR;
  }
  return mg_list_push(out, y);
}

static mg_status saving_backward (void *ud, const mg_grad_args *a) {
  (void)ud;
  mg_tensor *y = mg_custom_saved(a->ctx, 0);
  if (y == NULL || mg_custom_needs_input_grad(a->ctx, 0) != 1) return mg_seterror("nothing saved");
  return (a->din[0] = mg_mul(a->dout[0], y)) ? MG_OK : MG_ERR;
}

static void custom_context (void) {
  says("context outside a forward", mg_custom_context() == NULL, "no custom gradient's forward is running");
  says("save(NULL)", mg_custom_save(NULL, 0, NULL) == MG_ERR, "mg_custom_save: argument 'c' is NULL");
  static const mg_function fn = {"exp_saving", saving_forward, saving_backward, NULL, 0};
  int64_t s[1] = {1024}, first[1] = {0};
  mg_tensor *x = mg_full(s, 1, MG_FLOAT32, 0.5), *g = NULL;
  mg_tape *t = mg_tape_new(0, 1);
  mg_tape_watch(t, x);
  mg_list out = {0};
  mg_status st = mg_custom_call(&fn, NULL, 1, &x, &out);
  size_t held = mg_tape_saved_bytes(t);
  mg_tensor *y = st == MG_OK ? mg_sum(out.t[0], MG_ALL_AXES, 0) : NULL;
  mg_list_clear(&out);
  mg_tape_stop(t);
  st = y ? mg_tape_gradient(t, 1, &y, 1, &x, NULL, 0, &g) : MG_ERR;
  checks++;
  if (st != MG_OK || held != 4096 || fabs(mg_tensor_get(g, first) - exp(0.5)) > 1e-6 ||
      mg_tape_saved_bytes(t) != 0) {
    fprintf(stderr, "c_api_test: custom save: %s (held %zu)\n", st == MG_OK ? "wrong" : mg_errmsg(), held);
    failures++;
  }
  mg_loop_enter();
  int inside = mg_is_in_loop();
  mg_loop_leave();
  mg_loop_leave();                                 /* one too many: stays at 0 */
  checks++;
  if (!inside || mg_is_in_loop()) {
    fprintf(stderr, "c_api_test: mg_is_in_loop\n");
    failures++;
  }
  mg_tensor_release(g);
  mg_tensor_release(y);
  mg_tensor_release(x);
  mg_tape_release(t);
}

/* the message must not contain `unwanted` */
static void lacks (const char *what, const char *unwanted) {
  checks++;
  if (strstr(mg_errmsg(), unwanted) != NULL) {
    fprintf(stderr, "c_api_test: %s: message \"%s\" has \"%s\"\n", what, mg_errmsg(), unwanted);
    failures++;
  }
}

/* positions in C's messages are C's, 0-based; Lua sees the same failures 1-based */
static void c_convention (void) {
  int64_t s23[2] = {2, 3}, s43[2] = {4, 3}, s13[2] = {1, 3};
  mg_tensor *x = mg_full(s23, 2, MG_FLOAT32, 1), *y = mg_full(s43, 2, MG_FLOAT32, 1);
  mg_tensor *z = mg_full(s13, 2, MG_FLOAT64, 1);
  says("sum(x, 5)", mg_sum(x, 5, 0) == NULL,
       "sum: axis 5 is out of range for 2 dimensions (use 0..1 or -2..-1)");
  lacks("sum(x, 5)", "axis 6");
  says("sum(x, -3)", mg_sum(x, -3, 0) == NULL, "axis -3 is out of range");
  says("squeeze(x, 0)", mg_squeeze(x, 0) == NULL, "squeeze: dimension 0 has size 2, not 1");
  says("select(x, 1, 3)", mg_select(x, 1, 3) == NULL,
       "select: index 3 is out of bounds for dimension 1 of size 3 (use 0..2 or -3..-1)");   /* 0-based to C */
  says("x + y", mg_add(x, y) == NULL, "(dimension 0: 2 vs 4)");
  mg_tensor *xy[2] = {x, y}, *xz[2] = {x, z};
  says("concat(x, y, 1)", mg_concat(xy, 2, 1) == NULL, "outside axis 1: tensor 0 is (2,3), tensor 1 is (4,3)");
  says("concat(x, z, 0)", mg_concat(xz, 2, 0) == NULL, "tensor 0 is float32, tensor 1 is float64");
  says("stack(x, y)", mg_stack(xy, 2, 0) == NULL, "tensor 0 is (2,3), tensor 1 is (4,3)");
  int64_t s1[1] = {1};
  mg_tensor *idx = mg_full_int64(s1, 1, 5);
  says("gather(x, 5, axis 1)", mg_gather(x, idx, 1) == NULL, "index 5 is out of bounds for dimension 1 of size 3");

  /* the same failures through Lua: Lua's positions */
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "moongrad", luaopen_moongrad, 0);
  lua_setglobal(L, "mg");
  static const struct { const char *code, *want; } lua_cases[] = {
    {"mg.ones{2, 3}:squeeze(1)", "dimension 1 has size 2, not 1"},
    {"local _ = mg.ones{2, 3} + mg.ones{4, 3}", "(dimension 1: 2 vs 4)"},
    {"mg.concat({mg.ones{2, 3}, mg.ones{4, 3}}, 2)", "outside axis 2: tensor 1 is (2,3), tensor 2 is (4,3)"},
    {"mg.ones{2, 3}:gather(mg.tensor({4}, 'int64'), 2)", "index 4 is out of bounds for dimension 2 of size 3"},
  };
  for (size_t i = 0; i < sizeof lua_cases / sizeof lua_cases[0]; i++) {
    checks++;
    const char *got = luaL_dostring(L, lua_cases[i].code) == LUA_OK ? "(no error)" : lua_tostring(L, -1);
    if (strstr(got, lua_cases[i].want) == NULL) {
      fprintf(stderr, "c_api_test: Lua %s: message \"%s\" lacks \"%s\"\n", lua_cases[i].code, got, lua_cases[i].want);
      failures++;
    }
    lua_settop(L, 0);
  }
  lua_close(L);
  mg_tensor_release(idx);
  mg_tensor_release(x);
  mg_tensor_release(y);
  mg_tensor_release(z);
}

/* every failure sets its own message: a NULL argument after an unrelated,
** older failure names the function and the argument first, and the old
** failure only as "the last error"; each registry op with a C signature of
** its kind, given NULL */
static void null_after_unrelated (void) {
  int64_t s2[1] = {2};
  mg_tensor *x = mg_full(s2, 1, MG_FLOAT32, 1);
  for (int i = 0; i < mg_op_count(); i++) {
    const mg_opinfo *op = mg_op_info(i);
    if (op->kind == MG_OP_OTHER) continue;
    mg_seterror("unrelated: an old failure");
    mg_tensor *r = op->kind == MG_OP_UNARY ? op->fn.unary(NULL)
                 : op->kind == MG_OP_BINARY ? op->fn.binary(x, NULL)
                 : op->fn.reduce(NULL, MG_ALL_AXES, 0);
    char what[64], want[96];
    snprintf(what, sizeof what, "%s(NULL) after an unrelated failure", op->name);
    snprintf(want, sizeof want, "mg_%s: argument '%s' is NULL (the last error was: unrelated", op->name,
             op->kind == MG_OP_BINARY ? "b" : "x");
    checks++;
    if (r != NULL || strncmp(mg_errmsg(), want, strlen(want)) != 0) {
      fprintf(stderr, "c_api_test: %s: message \"%s\" does not begin \"%s\"\n", what, mg_errmsg(), want);
      failures++;
    }
  }
  /* a NULL right after the failure that made it still names that failure */
  int64_t s3[1] = {3};
  mg_tensor *w = mg_full(s3, 1, MG_FLOAT32, 1);
  says("exp(add(bad shapes))", mg_exp(mg_add(x, w)) == NULL, "the last error was: add: shapes do not broadcast");
  mg_tensor_release(w);
  mg_tensor_release(x);
}

/* autocast from C: products in bfloat16 between push and pop, gradients in
** the variables' float32, a refused dtype names why, a region left open
** by a host is still closed by the pop */
static void autocast (void) {
  int64_t s2[2] = {4, 4};
  mg_tensor *x = mg_full(s2, 2, MG_FLOAT32, 0.5);
  mg_variable *w = mg_variable_new(x, "w", 1);
  if (!mg_cpu_has_float16())
    says("push(float16)", mg_autocast_push(MG_FLOAT16) == MG_ERR, "autocast: float16 needs a CPU with AVX512-FP16");
  /* emulated float16: a float16 product, the previous setting given back */
  bool was = mg_autocast_emulate_float16(true);
  checks++;
  mg_tensor *h = NULL;
  if (mg_autocast_push(MG_FLOAT16) != MG_OK || (h = mg_matmul(x, x)) == NULL || mg_tensor_dtype(h) != MG_FLOAT16 ||
      mg_tensor_get(h, (int64_t[]){0, 0}) != 1.0 || mg_autocast_emulate_float16(was) != true) {
    fprintf(stderr, "c_api_test: float16 autocast: %s\n", mg_errmsg());
    failures++;
  }
  mg_autocast_pop();
  mg_tensor_release(h);
  says("push(int64)", mg_autocast_push(MG_INT64) == MG_ERR, "autocast: dtype must be bfloat16");
  mg_tape *t = mg_tape_new(0, 1);
  checks++;
  if (mg_autocast_push(MG_BFLOAT16) != MG_OK || mg_autocast_dtype() != MG_BFLOAT16 || mg_autocast_depth() != 1) {
    fprintf(stderr, "c_api_test: autocast_push(bfloat16): %s\n", mg_errmsg());
    failures++;
  }
  mg_tensor *wv = mg_variable_read(w);       /* borrowed */
  mg_tensor *y = mg_matmul(x, wv);
  mg_tensor *s = mg_sum(y, MG_ALL_AXES, 0);
  mg_autocast_pop();
  checks++;
  if (y == NULL || mg_tensor_dtype(y) != MG_BFLOAT16 || s == NULL || mg_tensor_dtype(s) != MG_FLOAT32 ||
      mg_autocast_dtype() != MG_FLOAT32) {
    fprintf(stderr, "c_api_test: matmul under autocast: %s\n", y ? mg_dtype_name(mg_tensor_dtype(y)) : mg_errmsg());
    failures++;
  }
  mg_tensor *g = NULL;
  mg_tensor *src[1] = {wv};
  checks++;
  if (s == NULL || mg_tape_gradient(t, 1, &s, 1, src, NULL, 0, &g) != MG_OK || g == NULL ||
      mg_tensor_dtype(g) != MG_FLOAT32 || fabs(mg_tensor_get(g, (int64_t[]){0, 0}) - 2.0) > 1e-2) {
    fprintf(stderr, "c_api_test: gradient under autocast: %s\n", mg_errmsg());
    failures++;
  }
  mg_tensor_release(g);
  mg_tensor_release(s);
  mg_tensor_release(y);
  mg_tape_release(t);
  mg_variable_release(w);
  mg_tensor_release(x);
}

/* recompute's verify from C: a forward that scales by a counter computes
** other values when it runs again; with MG_FN_VERIFY the gradient says
** which op, and mg_recompute_verify switches it on for every function */
static mg_status scaled_forward (void *ud, int nin, mg_tensor *const *in, mg_list *out) {
  (void)nin;
  int *runs = (int *)ud;
  ++*runs;
  mg_tensor *k = mg_scalar((double)*runs, MG_FLOAT32);
  mg_status st = mg_list_push(out, mg_mul(in[0], k));
  mg_tensor_release(k);
  return st;
}

static void verified_gradient (unsigned flags, const char *what, const char *want) {
  int64_t s1[1] = {3};
  int runs = 0;
  mg_function fn = {"scaled", scaled_forward, NULL, NULL, flags};
  mg_tensor *x = mg_full(s1, 1, MG_FLOAT32, 0.5);
  mg_tape *t = mg_tape_new(0, 1);
  mg_tape_watch(t, x);
  mg_list out = {0};
  mg_tensor *s = mg_recompute_call(&fn, &runs, 1, &x, &out) == MG_OK ? mg_sum(out.t[0], MG_ALL_AXES, 0) : NULL;
  mg_tensor *g = NULL;
  says(what, s == NULL || mg_tape_gradient(t, 1, &s, 1, &x, NULL, 0, &g) == MG_ERR, want);
  mg_tensor_release(g);
  mg_tensor_release(s);
  mg_list_clear(&out);
  mg_tape_release(t);
  mg_tensor_release(x);
}

static void recompute_verify (void) {
  verified_gradient(MG_FN_VERIFY, "recompute with MG_FN_VERIFY",
                    "scaled: verify: the re-run's op 0 (mul, (3) float32) computed other values");
  checks++;
  if (mg_recompute_verify(1) != 0 || mg_recompute_verify(-1) != 1) {
    fprintf(stderr, "c_api_test: mg_recompute_verify does not keep its setting\n");
    failures++;
  }
  verified_gradient(0, "recompute under mg_recompute_verify(1)", "scaled: verify: the re-run's op 0 (mul");
  mg_recompute_verify(0);
  verified_gradient(0, "recompute unverified", "the recomputed function gave output 0 other values");  /* C counts from 0 */
}

/* a dry run from C: a product is allocated and counted, not computed; a
** variable keeps its value; a second begin fails; the peak before comes back */
static void dry_run (void) {
  int64_t s2[2] = {256, 256};
  mg_tensor *a = mg_full(s2, 2, MG_FLOAT32, 1.0);
  mg_variable *v = mg_variable_new(a, "v", 1);
  mg_memory_reset_peak();
  size_t before = mg_memory_stats_get().peak_bytes;
  checks++;
  if (mg_dry_run_begin(NULL, NULL) != MG_OK || !mg_dry_running()) {
    fprintf(stderr, "c_api_test: mg_dry_run_begin: %s\n", mg_errmsg());
    failures++;
  }
  says("a second mg_dry_run_begin", mg_dry_run_begin(NULL, NULL) == MG_ERR, "estimates do not nest");
  mg_tensor *p = mg_matmul(a, a);
  mg_tensor *q = p ? mg_add(p, a) : NULL;
  if (q) mg_variable_assign(v, q);
  int was = mg_dry_run_pause();
  mg_tensor *real = mg_add(a, a);                 /* computed: the pause */
  mg_dry_run_resume(was);
  mg_tensor_release(q);
  mg_memory_stats st = mg_dry_run_end(), now = mg_memory_stats_get();
  /* the product kept past the dry run has no values: refused, never read */
  const char *dry = "computed in a dry run (mg.memory.estimate), which computes no values";
  checks++;
  if (p == NULL || mg_tensor_has_values(p) || !mg_tensor_has_values(a)) {
    fprintf(stderr, "c_api_test: mg_tensor_has_values of a dry run's product and of a real tensor\n");
    failures++;
  }
  says("an op of a dry run's product", mg_add(p, a) == NULL, dry);
  says("mg_to_dlpack of a dry run's product", mg_to_dlpack(p) == NULL, dry);
  says("mg_tensor_get of a dry run's product", isnan(mg_tensor_get(p, (int64_t[]){0, 0})), dry);
  says("mg_tensor_need_values", mg_tensor_need_values(p, "host") == MG_ERR, "host: this tensor was computed");
  mg_tensor_release(p);
  checks++;
  size_t product = 256 * 256 * 4, back = before > now.current_bytes ? before : now.current_bytes;
  if (st.peak_bytes < before + 2 * product || mg_dry_running() || now.peak_bytes != back ||
      real == NULL || mg_tensor_get(real, (int64_t[]){3, 4}) != 2.0 ||
      mg_tensor_get(mg_variable_read(v), (int64_t[]){3, 4}) != 1.0) {
    fprintf(stderr, "c_api_test: dry run: peak %zu (before %zu), the variable %g, the paused sum %g\n", st.peak_bytes,
            before, mg_tensor_get(mg_variable_read(v), (int64_t[]){3, 4}), real ? mg_tensor_get(real, (int64_t[]){3, 4}) : -1);
    failures++;
  }
  mg_memory_reset_peak();
  mg_tensor_release(real);
  mg_variable_release(v);
  mg_tensor_release(a);
}

/* mg_tape_gradient_hooked: each source's gradient reaches ready once, as
** soon as no node left adds to it (latest-read first), equal to the plain
** gradient; a taken one is NULL in grads, but one an op made (a) is never
** taken, its maker still needing it; an unconnected source gets no call;
** tick runs per node; a hook's error stops the walk and says why */
typedef struct { int order[8], n, ticks, fail_at; mg_tensor *seen[8]; } hook_log;

static mg_status log_ready (void *ud, int s, mg_tensor *g, int *take) {
  hook_log *h = ud;
  if (h->n == h->fail_at) return mg_seterror("my hook: no room");
  h->order[h->n++] = s;
  mg_tensor *one = mg_scalar(1.0, MG_FLOAT32);
  h->seen[s] = mg_mul(g, one);              /* a copy of what it was then */
  mg_tensor_release(one);
  *take = s == 0 || s == 4;
  return MG_OK;
}

static void log_tick (void *ud) { ((hook_log *)ud)->ticks++; }

static double max_diff (mg_tensor *a, mg_tensor *b) {
  double d = 0;
  for (int64_t i = 0; i < mg_tensor_numel(a); i++) {
    double x = fabs(mg_tensor_get(a, &i) - mg_tensor_get(b, &i));
    if (x > d) d = x;
  }
  return d;
}

static void gradient_hooks (void) {
  int64_t s3[1] = {3};
  mg_tensor *x = mg_full(s3, 1, MG_FLOAT32, 0.5), *lonely = mg_full(s3, 1, MG_FLOAT32, 2);
  mg_variable *w1 = mg_variable_new(x, "w1", 1), *w2 = mg_variable_new(x, "w2", 1), *w3 = mg_variable_new(x, "w3", 1);
  for (int fail = 0; fail < 2; fail++) {
    mg_tape *t = mg_tape_new(1, 1);
    mg_tensor *a = mg_mul(mg_variable_read(w1), x), *b = mg_tanh(a), *c = mg_mul(mg_variable_read(w2), b);
    mg_tensor *d = mg_mul(c, mg_variable_read(w2));                /* w2 twice */
    mg_tensor *s1 = mg_sum(d, MG_ALL_AXES, 0), *s2 = mg_sum(mg_variable_read(w3), MG_ALL_AXES, 0);
    mg_tensor *y = mg_add(s1, s2);
    mg_tensor *src[5] = {mg_variable_read(w1), mg_variable_read(w2), mg_variable_read(w3), lonely, a};
    mg_tape_stop(t);
    mg_tensor *plain[5] = {0}, *got[5] = {0};
    hook_log h = {.fail_at = fail ? 1 : -1};
    mg_gradient_hooks hooks = {log_ready, log_tick, &h};
    mg_status ps = mg_tape_gradient(t, 1, &y, 5, src, NULL, 0, plain);
    mg_status hs = mg_tape_gradient_hooked(t, 1, &y, 5, src, NULL, 0, &hooks, got);
    checks++;
    if (fail) {
      says("a hook's error", hs == MG_ERR, "tape:gradient: my hook: no room");
    } else if (ps != MG_OK || hs != MG_OK || h.n != 4 || h.order[0] != 2 || h.order[1] != 1 || h.order[2] != 4 ||
               h.order[3] != 0 || h.ticks < 5 || got[0] != NULL || got[1] == NULL || got[2] == NULL ||
               got[3] != NULL || plain[3] != NULL || got[4] == NULL || max_diff(got[1], plain[1]) != 0 ||
               max_diff(got[2], plain[2]) != 0 || max_diff(got[4], plain[4]) != 0) {
      fprintf(stderr, "c_api_test: gradient hooks: %d calls (%d %d %d %d), %d ticks: %s\n", h.n, h.order[0],
              h.order[1], h.order[2], h.order[3], h.ticks, hs == MG_OK ? "wrong gradients" : mg_errmsg());
      failures++;
    }
    for (int s = 0; s < 5 && !fail; s++) {
      if (s == 3) continue;                         /* lonely: unconnected */
      checks++;
      if (h.seen[s] == NULL || plain[s] == NULL || max_diff(h.seen[s], plain[s]) != 0) {
        fprintf(stderr, "c_api_test: gradient hooks: source %d handed over before it was whole\n", s);
        failures++;
      }
    }
    for (int s = 0; s < 5; s++) {
      mg_tensor_release(plain[s]);
      mg_tensor_release(got[s]);
      mg_tensor_release(h.seen[s]);
    }
    mg_tensor *made[] = {a, b, c, d, s1, s2, y};
    for (int k = 0; k < 7; k++) mg_tensor_release(made[k]);
    mg_tape_release(t);
  }
  mg_variable_release(w1);
  mg_variable_release(w2);
  mg_variable_release(w3);
  mg_tensor_release(lonely);
  mg_tensor_release(x);
}

int main (void) {
  gradient_hooks();
  null_arguments();
  autocast();
  recompute_verify();
  dry_run();
  c_convention();
  null_after_unrelated();
  custom_context();
  exchange();
  out_of_range();
  tape_outlives_state();
  mg_memory_stats st = mg_memory_stats_get();
  checks++;
  if (st.live_tensors != 0) {
    fprintf(stderr, "c_api_test: %lld tensors left alive\n", (long long)st.live_tensors);
    failures++;
  }
  if (failures) {
    fprintf(stderr, "c_api_test: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  printf("c_api_test: all %d checks passed\n", checks);
  return 0;
}
