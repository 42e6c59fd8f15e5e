/*
** einsum.c — Einstein summation over one or two operands, built from
** public ops.
**
** The spec is parsed into letters. In each operand a repeated letter takes
** the diagonal (the pair of axes flattened, then a gather), and letters
** that neither the output nor the other operand has are summed away. Two
** operands are then permuted and reshaped so that the whole contraction is
** one batched matmul, (batch, kept of a, contracted) @ (batch, contracted,
** kept of b), which goes to BLAS; an operand already laid out the other way
** round is reshaped and transposed instead, so it reaches the GEMM as a
** transposed view rather than a copy. The product is reshaped and permuted
** into the output's order. Every step is a public op with its own rule, so
** the gradient (and its gradient) comes for free.
*/
#include <stdio.h>
#include <string.h>

#include "ops/op.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define EINSUM_OPS(X) \
  X(EINSUM, einsum)
enum { EINSUM_OPS(MG_ROW_ENUM) EINSUM__COUNT };

#define MAX_LETTERS 64

typedef struct term { int n; char c[MAX_LETTERS]; } term;   /* one operand's letters */

static bool is_letter (char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

static int find (const term *t, char ch) {
  for (int i = 0; t && i < t->n; i++) if (t->c[i] == ch) return i;
  return -1;
}

/* reads spec into in[0..1] and out; returns the number of operand terms
** (counting past 2, so the caller can say how many), or -1 + error */
static int parse (const char *spec, term *in, term *out, bool *arrow) {
  int nt = 1;
  term spare, *cur = &in[0];
  in[0].n = in[1].n = out->n = 0;
  *arrow = false;
  for (const char *p = spec; *p; p++) {
    char ch = *p;
    if (ch == ' ') continue;
    if (is_letter(ch)) {
      if (cur->n == MAX_LETTERS) return mg_seterror("einsum: too many letters in one term of '%s'", spec), -1;
      cur->c[cur->n++] = ch;
    } else if (ch == '.') {
      return mg_seterror("einsum: ellipsis ('...') is not supported; name every axis with a letter"), -1;
    } else if (ch == ',') {
      if (*arrow) return mg_seterror("einsum: ',' after '->' in '%s' (the output is one term)", spec), -1;
      cur = ++nt <= 2 ? &in[nt - 1] : &spare;
      cur->n = 0;
    } else if (ch == '-' && p[1] == '>') {
      if (*arrow) return mg_seterror("einsum: '->' appears twice in '%s'", spec), -1;
      *arrow = true;
      cur = out;
      p++;
    } else {
      return mg_seterror("einsum: unexpected character '%c' in '%s' (letters, ',' and '->' only)", ch,
                         spec), -1;
    }
  }
  return nt;
}

/* the output without '->': the letters seen once, in alphabetical order (NumPy) */
static void implicit_output (const term *in, int n, term *out) {
  int count[128] = {0};
  for (int k = 0; k < n; k++)
    for (int i = 0; i < in[k].n; i++) count[(int)in[k].c[i]]++;
  out->n = 0;
  for (int ch = 0; ch < 128; ch++) if (count[ch] == 1) out->c[out->n++] = (char)ch;
}

/* x's axes p < q (same size) replaced by their diagonal, as its last axis */
static mg_tensor *diagonal (mg_tensor *x, int p, int q) {
  int perm[MG_MAX_DIMS], k = 0;
  int64_t shape[MG_MAX_DIMS], n = x->shape[p];
  for (int d = 0; d < x->ndim; d++)
    if (d != p && d != q) { shape[k] = x->shape[d]; perm[k++] = d; }
  perm[k] = p;
  perm[k + 1] = q;
  shape[k] = n * n;
  mg_scope sc = {0};
  mg_tensor *y = mg_tmp(&sc, mg_permute(x, perm));
  mg_tensor *flat = mg_tmp(&sc, mg_reshape(y, shape, k + 1));
  mg_tensor *at = mg_tmp(&sc, mg_arange_int64(0, n * n, n + 1));    /* i * (n + 1) */
  mg_tensor *out = flat && at ? mg_gather(flat, at, k) : NULL;
  mg_scope_end(&sc);
  return out;
}

/*
** One operand made ready: its letters distinct (diagonals), the letters
** that neither `other` nor the output has summed away, and axes of size 1
** broadcast to their letter's size. Updates t to the result's letters.
*/
static mg_tensor *prepare (mg_tensor *x, term *t, const term *other, const term *out, const int64_t *size) {
  mg_tensor *cur = mg_tensor_retain(x);
  for (int p = 0; p < t->n && cur; p++)
    for (int q = p + 1; q < t->n && cur; q++) {
      if (t->c[q] != t->c[p]) continue;
      mg_tensor *d = diagonal(cur, p, q);
      mg_tensor_release(cur);
      cur = d;
      char ch = t->c[p];                       /* letters: the others, then ch */
      int k = 0;
      for (int i = 0; i < t->n; i++) if (i != p && i != q) t->c[k++] = t->c[i];
      t->c[k++] = ch;
      t->n = k;
      p = -1;                                  /* start again */
      break;
    }
  for (int d = t->n - 1; d >= 0 && cur; d--) {
    if (find(other, t->c[d]) >= 0 || find(out, t->c[d]) >= 0) continue;
    mg_tensor *s = mg_sum(cur, d, 0);
    mg_tensor_release(cur);
    cur = s;
    memmove(t->c + d, t->c + d + 1, (size_t)(t->n - d - 1));
    t->n--;
  }
  if (cur == NULL) return NULL;
  int64_t full[MG_MAX_DIMS];
  bool wider = false;
  for (int d = 0; d < t->n; d++) {
    full[d] = size[(int)t->c[d]];
    wider = wider || full[d] != cur->shape[d];
  }
  if (wider) {
    mg_tensor *b = mg_broadcast_to(cur, full, t->n);
    mg_tensor_release(cur);
    cur = b;
  }
  return cur;
}

/* x's axes in the order of `want` (letters of t), a view; x itself when already so */
static mg_tensor *arrange (mg_tensor *x, const term *t, const char *want) {
  int perm[MG_MAX_DIMS];
  bool same = true;
  for (int i = 0; i < t->n; i++) {
    perm[i] = find(t, want[i]);
    same = same && perm[i] == i;
  }
  return same ? mg_tensor_retain(x) : mg_permute(x, perm);
}

static bool in_order (const term *t, const char *want) {
  for (int i = 0; i < t->n; i++) if (t->c[i] != want[i]) return false;
  return true;
}

static int64_t product (const int64_t *size, const char *letters, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; i++) p *= size[(int)letters[i]];
  return p;
}

/* x as (B, rows, cols) from letters `first` then `second` after the batch;
** when x is laid out (batch, second, first) it is reshaped so and
** transposed (a view), which the GEMM takes without a copy */
static mg_tensor *as_matrices (mg_tensor *x, const term *t, const char *batch, int nb, const char *first,
                               int nf, const char *second, int ns, const int64_t *size) {
  char one[MAX_LETTERS], two[MAX_LETTERS];
  memcpy(one, batch, (size_t)nb);
  memcpy(one + nb, first, (size_t)nf);
  memcpy(one + nb + nf, second, (size_t)ns);
  memcpy(two, batch, (size_t)nb);
  memcpy(two + nb, second, (size_t)ns);
  memcpy(two + nb + ns, first, (size_t)nf);
  bool swapped = !in_order(t, one) && in_order(t, two);
  int64_t B = product(size, batch, nb), R = product(size, first, nf), C = product(size, second, ns);
  int64_t shape[3] = {B, swapped ? C : R, swapped ? R : C};
  mg_scope sc = {0};
  mg_tensor *y = mg_tmp(&sc, arrange(x, t, swapped ? two : one));
  mg_tensor *m = mg_tmp(&sc, mg_reshape(y, shape, 3));
  mg_tensor *r = swapped ? mg_transpose(m, -2, -1) : mg_retain_or_null(m);
  mg_scope_end(&sc);
  return r;
}

/* the contraction of two prepared operands, letters ta and tb, into out's order */
static mg_tensor *contract (mg_tensor *a, const term *ta, mg_tensor *b, const term *tb, const term *out,
                            const int64_t *size) {
  char batch[MAX_LETTERS], con[MAX_LETTERS], ka[MAX_LETTERS], kb[MAX_LETTERS];
  int nb = 0, nc = 0, na = 0, nk = 0;
  for (int i = 0; i < ta->n; i++) {
    char ch = ta->c[i];
    if (find(tb, ch) < 0) ka[na++] = ch;
    else if (find(out, ch) >= 0) batch[nb++] = ch;
    else con[nc++] = ch;
  }
  for (int i = 0; i < tb->n; i++) if (find(ta, tb->c[i]) < 0) kb[nk++] = tb->c[i];
  mg_scope sc = {0};
  mg_tensor *a3 = mg_tmp(&sc, as_matrices(a, ta, batch, nb, ka, na, con, nc, size));
  mg_tensor *b3 = mg_tmp(&sc, as_matrices(b, tb, batch, nb, con, nc, kb, nk, size));
  mg_tensor *p = a3 && b3 ? mg_tmp(&sc, mg_matmul(a3, b3)) : NULL;    /* (B, rows of a, cols of b) */
  term got = {0};
  int64_t shape[MG_MAX_DIMS];
  memcpy(got.c, batch, (size_t)nb);
  memcpy(got.c + nb, ka, (size_t)na);
  memcpy(got.c + nb + na, kb, (size_t)nk);
  got.n = nb + na + nk;                         /* the output's letters: at most MG_MAX_DIMS */
  for (int i = 0; i < got.n; i++) shape[i] = size[(int)got.c[i]];
  mg_tensor *r = p ? mg_tmp(&sc, mg_reshape(p, shape, got.n)) : NULL;
  mg_tensor *res = r ? arrange(r, &got, out->c) : NULL;
  mg_scope_end(&sc);
  return res;
}

/* the letters' sizes, checking that they agree (1 broadcasts across operands) */
static mg_status letter_sizes (mg_tensor *const *xs, const term *t, int n, int64_t *size) {
  int owner[128];
  for (int ch = 0; ch < 128; ch++) { size[ch] = -1; owner[ch] = -1; }
  for (int k = 0; k < n; k++)
    for (int i = 0; i < t[k].n; i++) {
      int ch = t[k].c[i];
      int64_t s = xs[k]->shape[i];
      if (size[ch] < 0 || size[ch] == s) {
        if (size[ch] < 0) owner[ch] = k;
      } else if (s != 1 && size[ch] != 1) {
        return mg_seterror("einsum: letter '%c' has size %lld in operand " MG_POS " but %lld in operand " MG_POS, ch,
                           (long long)size[ch], (long long)owner[ch], (long long)s, (long long)k);
      }
      if (s > size[ch]) size[ch] = s;
    }
  return MG_OK;
}

/* einsum: out = the sum over the letters not in the output of the
** products of the operands' entries, as NumPy's einsum (one or two
** operands, no ellipsis).  grad: from permute, reshape, gather, sum and
** matmul, which it is made of */
mg_tensor *mg_einsum (const char *spec, int n, mg_tensor *const *xs) {
  MG_CHECK_ARG("mg_einsum", spec, NULL);
  if (n > 0) MG_CHECK_ARG("mg_einsum", xs, NULL);
  for (int k = 0; k < n; k++) if (xs[k] == NULL) return mg_null_arg("mg_einsum", "xs[k]"), NULL;
  if (n < 1) return mg_seterror("einsum: needs at least one operand"), NULL;
  if (n > 2) return mg_seterror("einsum: at most 2 operands are supported, got %d", n), NULL;
  term t[2], out;
  bool arrow;
  int nt = parse(spec, t, &out, &arrow);
  if (nt < 0) return NULL;
  if (nt != n)
    return mg_seterror("einsum: '%s' names %d operand%s, got %d", spec, nt, nt == 1 ? "" : "s", n), NULL;
  if (n == 2 && xs[0]->dtype != xs[1]->dtype)
    return mg_seterror("einsum: dtypes differ: %s and %s", mg_dtype_name(xs[0]->dtype),
                       mg_dtype_name(xs[1]->dtype)), NULL;
  for (int k = 0; k < n; k++)
    if (t[k].n != xs[k]->ndim)
      return mg_seterror("einsum: operand " MG_POS " has %d dimension%s, but '%.*s' names %d", (long long)k, xs[k]->ndim,
                         xs[k]->ndim == 1 ? "" : "s", t[k].n, t[k].c, t[k].n), NULL;
  if (!arrow) implicit_output(t, n, &out);
  for (int i = 0; i < out.n; i++) {
    if (find(&out, out.c[i]) != i)
      return mg_seterror("einsum: letter '%c' appears twice in the output", out.c[i]), NULL;
    if (find(&t[0], out.c[i]) < 0 && (n < 2 || find(&t[1], out.c[i]) < 0))
      return mg_seterror("einsum: output letter '%c' appears in no operand", out.c[i]), NULL;
  }
  if (out.n > MG_MAX_DIMS)
    return mg_seterror("einsum: the output would have %d dimensions, at most %d allowed", out.n,
                       MG_MAX_DIMS), NULL;
  for (int k = 0; k < n; k++)                  /* a diagonal needs a square */
    for (int p = 0; p < t[k].n; p++)
      for (int q = p + 1; q < t[k].n; q++)
        if (t[k].c[p] == t[k].c[q] && xs[k]->shape[p] != xs[k]->shape[q])
          return mg_seterror("einsum: letter '%c' has sizes %lld and %lld in operand " MG_POS " (a repeated "
                             "letter takes a diagonal)", t[k].c[p], (long long)xs[k]->shape[p],
                             (long long)xs[k]->shape[q], (long long)k), NULL;
  int64_t size[128];
  if (letter_sizes(xs, t, n, size) != MG_OK) return NULL;
  mg_scope sc = {0};
  mg_tensor *a = mg_tmp(&sc, prepare(xs[0], &t[0], n == 2 ? &t[1] : NULL, &out, size));
  mg_tensor *r = NULL;
  if (n == 1) {
    r = a ? arrange(a, &t[0], out.c) : NULL;
  } else {
    mg_tensor *b = a ? mg_tmp(&sc, prepare(xs[1], &t[1], &t[0], &out, size)) : NULL;
    r = b ? contract(a, &t[0], b, &t[1], &out, size) : NULL;
  }
  mg_scope_end(&sc);
  return r;
}

MG_ROW(EINSUM, einsum) = {
  .info = {.name = "einsum", .kind = MG_OP_OTHER,
           .doc = "Einstein summation of one or two operands (one batched matmul; its gradient is its parts')",
           .product = 1},
};

MG_FAMILY(mg_einsum_ops, EINSUM_OPS, EINSUM__COUNT);
