/*
** conv.c — convolution and pooling on NHWC tensors, through oneDNN's
** primitives, with a float64 reference path.
**
** Images are (N,H,W,C) and filters (KH,KW,C,O), as TensorFlow has them.
** float32 goes to oneDNN: activations stay NHWC (its jit kernels read and
** write that layout directly), and only the filters, which are small, are
** reordered to the layout the kernel wants, on every call (a variable's
** values share one id, so a reordered copy could not be cached safely).
** float64, and any case oneDNN declines, runs direct C loops: they are the
** reference the specs hold float32 to, and what gradient checks use.
**
** Seven rows, closed under differentiation, so gradients of any order exist:
**   conv2d(x, w [, b])            grad: backward_input, backward_filter, sum
**   conv2d_backward_input(dy, w)  bilinear: grad conv2d, backward_filter
**   conv2d_backward_filter(x, dy) bilinear: grad backward_input, conv2d
**   max_pool2d(x)                 grad: max_pool2d_backward
**   max_pool2d_backward(x, dy)    linear in dy: grad take_along_axis at the maxima
**   avg_pool2d(x) / avg_pool2d_backward(dy), each the other's adjoint
**
** oneDNN's primitives are kept per thread by dnn.c, keyed by the geometry
** and the thread count: a descriptor costs about 100 us to make, a step
** reuses it.
*/
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>
#include <omp.h>

#include "dnn.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define CONV_OPS(X) \
  X(CONV2D, conv2d) X(CONV2D_BI, conv2d_bi) X(CONV2D_BF, conv2d_bf) X(MAX_POOL, max_pool) \
  X(MAX_POOL_BWD, max_pool_bwd) X(AVG_POOL, avg_pool) X(AVG_POOL_BWD, avg_pool_bwd)
enum { CONV_OPS(MG_ROW_ENUM) CONV__COUNT };


/* {========================= geometry ========================== */

/* everything a convolution or pool needs to know of its shapes */
typedef struct geom {
  int64_t N, H, W, C;        /* input (N,H,W,C) */
  int64_t KH, KW, O;         /* filters (KH,KW,C,O); pools: the window, O = C */
  int64_t OH, OW;            /* output (N,OH,OW,O) */
  int64_t sh, sw, dh, dw;    /* strides, dilation (1: none) */
  int64_t pt, pb, pl, pr;    /* padding: top, bottom, left, right */
} geom;

#define GEOM_MAX (INT64_C(1) << 30)    /* bound on strides, dilation and pads */

static char *shape_s (char *buf, size_t n, const int64_t *shape, int ndim) {
  return mg_shape_str(buf, n, shape, ndim);
}

/* the extent of k taps d apart, or -1 when it does not fit an int64 */
static int64_t extent (int64_t k, int64_t d) {
  return k - 1 > (INT64_MAX / 4) / d ? -1 : (k - 1) * d + 1;
}

/* one spatial dimension: in pixels, window k dilated by d, stride s ->
** pads and the output size (-1 + error when the window does not fit) */
static int64_t out_size (const char *fn, const char *dim, int64_t in, int64_t k, int64_t s, int64_t d,
                         mg_padding padding, int64_t *before, int64_t *after) {
  int64_t ext = extent(k, d);
  if (ext < 0) return mg_seterror("%s: the %s extent of the window is too large", fn, dim), -1;
  if (padding == MG_PADDING_SAME) {          /* TensorFlow's: out = ceil(in / s) */
    int64_t out = in / s + (in % s != 0);
    int64_t total = out > 0 ? (out - 1) * s + ext - in : 0;
    if (total < 0) total = 0;
    *before = total / 2;
    *after = total - *before;
    return out;
  }
  if (padding == MG_PADDING_VALID) *before = *after = 0;
  int64_t padded = in + *before + *after;
  if (padded < ext)
    return mg_seterror("%s: the window's %s (%lld, dilated: %lld) is larger than the padded input's (%lld)",
                       fn, dim, (long long)k, (long long)ext, (long long)padded), -1;
  return (padded - ext) / s + 1;
}

/* Fills g for an input of shape xs (N,H,W,C) and a window (KH,KW) with O
** outputs; pool: strides default to the window and explicit pads are
** refused. MG_ERR + error naming fn. */
static mg_status geom_init (const char *fn, geom *g, const int64_t *xs, int64_t KH, int64_t KW, int64_t O,
                            const mg_conv_params *p, bool pool) {
  static const mg_conv_params none;
  if (p == NULL) p = &none;
  g->N = xs[0]; g->H = xs[1]; g->W = xs[2]; g->C = xs[3];
  g->KH = KH; g->KW = KW; g->O = O;
  g->sh = p->strides[0] ? p->strides[0] : pool ? KH : 1;
  g->sw = p->strides[1] ? p->strides[1] : pool ? KW : 1;
  g->dh = p->dilation[0] ? p->dilation[0] : 1;
  g->dw = p->dilation[1] ? p->dilation[1] : 1;
  if (g->sh < 1 || g->sw < 1 || g->sh > GEOM_MAX || g->sw > GEOM_MAX)
    return mg_seterror("%s: strides must be 1 to 2^30, got (%lld,%lld)", fn, (long long)g->sh, (long long)g->sw);
  if (g->dh < 1 || g->dw < 1 || g->dh > GEOM_MAX || g->dw > GEOM_MAX)
    return mg_seterror("%s: dilation must be 1 to 2^30, got (%lld,%lld)", fn, (long long)g->dh, (long long)g->dw);
  if (KH < 1 || KW < 1)
    return mg_seterror("%s: the window must be at least 1x1, got %lldx%lld", fn, (long long)KH, (long long)KW);
  if ((unsigned)p->padding > MG_PADDING_EXPLICIT)
    return mg_seterror("%s: padding %d is not valid, same or explicit", fn, (int)p->padding);
  g->pt = g->pb = g->pl = g->pr = 0;
  if (p->padding == MG_PADDING_EXPLICIT) {
    if (pool) return mg_seterror("%s: padding must be valid or same (explicit pads are for convolutions)", fn);
    for (int i = 0; i < 4; i++)
      if (p->pads[i] < 0 || p->pads[i] > GEOM_MAX)
        return mg_seterror("%s: pads must be 0 to 2^30, got (%lld,%lld,%lld,%lld)", fn, (long long)p->pads[0],
                           (long long)p->pads[1], (long long)p->pads[2], (long long)p->pads[3]);
    g->pt = p->pads[0]; g->pb = p->pads[1]; g->pl = p->pads[2]; g->pr = p->pads[3];
  }
  if ((g->OH = out_size(fn, "height", g->H, KH, g->sh, g->dh, p->padding, &g->pt, &g->pb)) < 0) return MG_ERR;
  if ((g->OW = out_size(fn, "width", g->W, KW, g->sw, g->dw, p->padding, &g->pl, &g->pr)) < 0) return MG_ERR;
  return MG_OK;
}

/* the geometry travels in the node's attributes, for the backward rules */
static void geom_to_attr (const geom *g, mg_attr *a) {
  memset(a, 0, sizeof *a);
  int64_t v[] = {g->N, g->H, g->W, g->C, g->KH, g->KW, g->O, g->OH, g->OW,
                 g->sh, g->sw, g->dh, g->dw, g->pt, g->pb, g->pl, g->pr};
  memcpy(a->a, v, sizeof(int64_t) * 8);
  memcpy(a->b, v + 8, sizeof(int64_t) * 8);
  a->c[0] = v[16];
}

static void geom_from_attr (geom *g, const mg_attr *a) {
  int64_t v[17];
  memcpy(v, a->a, sizeof(int64_t) * 8);
  memcpy(v + 8, a->b, sizeof(int64_t) * 8);
  v[16] = a->c[0];
  g->N = v[0]; g->H = v[1]; g->W = v[2]; g->C = v[3]; g->KH = v[4]; g->KW = v[5]; g->O = v[6];
  g->OH = v[7]; g->OW = v[8]; g->sh = v[9]; g->sw = v[10]; g->dh = v[11]; g->dw = v[12];
  g->pt = v[13]; g->pb = v[14]; g->pl = v[15]; g->pr = v[16];
}

static int64_t out_numel (const geom *g) { return g->N * g->OH * g->OW * g->O; }

/* checks shared by every entry: t is a float32/float64 tensor (or bfloat16,
** for the convolutions: autocast's) with 4 dims */
static mg_status check_image (const char *fn, const char *what, const char *dims, const mg_tensor *t) {
  char s[160];
  bool half = strncmp(fn, "conv2d", 6) == 0 || strncmp(fn, "max_pool2d", 10) == 0;   /* autocast's */
  if (!(mg_is_float(t->dtype) || (half && mg_is_half(t->dtype))))
    return mg_seterror("%s: %s must be float32%s or float64, got %s", fn, what, half ? ", bfloat16, float16" : "",
                       mg_dtype_name(t->dtype));
  if (t->ndim != 4)
    return mg_seterror("%s: %s must have 4 dimensions %s, got shape %s", fn, what, dims,
                       shape_s(s, sizeof s, t->shape, t->ndim));
  return MG_OK;
}

static mg_status check_same_dtype (const char *fn, const char *a, const mg_tensor *x, const char *b,
                                   const mg_tensor *y) {
  if (x->dtype == y->dtype) return MG_OK;
  return mg_seterror("%s: dtypes differ: %s is %s, %s is %s", fn, a, mg_dtype_name(x->dtype), b,
                     mg_dtype_name(y->dtype));
}

/* a shape given by the caller (input_shape, filter_shape): 4 sizes >= 0 */
static mg_status check_shape4 (const char *fn, const char *what, const int64_t *s) {
  if (s == NULL) return mg_seterror("%s: %s is NULL", fn, what);
  for (int i = 0; i < 4; i++)
    if (s[i] < 0) return mg_seterror("%s: %s has a negative size (%lld)", fn, what, (long long)s[i]);
  return mg_shape_numel(fn, s, 4) < 0 ? MG_ERR : MG_OK;
}

/* }============================================================= */


/* {================= reference loops (any float) ================= */
/* Direct loops over NHWC: the float64 path, and float32 wherever oneDNN
** declines. Each output element is written by one thread. */

/* y (N,OH,OW,O) = conv(x (N,H,W,C), w (KH,KW,C,O)) + b */
#define CONV_FWD(T) do {                                                            \
    const T *X = (const T *)x, *Wt = (const T *)w, *B = (const T *)b; T *Y = (T *)y; \
    MG_PARALLEL_FOR(out_numel(g) * g->C * g->KH * g->KW > 65536, collapse(2),        \
    for (int64_t n = 0; n < g->N; n++)                                              \
      for (int64_t oh = 0; oh < g->OH; oh++)                                        \
        for (int64_t ow = 0; ow < g->OW; ow++) {                                    \
          T *yp = Y + ((n * g->OH + oh) * g->OW + ow) * g->O;                       \
          for (int64_t o = 0; o < g->O; o++) yp[o] = B ? B[o] : 0;                  \
          for (int64_t u = 0; u < g->KH; u++) {                                     \
            int64_t ih = oh * g->sh + u * g->dh - g->pt;                            \
            if (ih < 0 || ih >= g->H) continue;                                     \
            for (int64_t v = 0; v < g->KW; v++) {                                   \
              int64_t iw = ow * g->sw + v * g->dw - g->pl;                          \
              if (iw < 0 || iw >= g->W) continue;                                   \
              const T *xp = X + ((n * g->H + ih) * g->W + iw) * g->C;               \
              const T *wp = Wt + (u * g->KW + v) * g->C * g->O;                     \
              for (int64_t c = 0; c < g->C; c++) {                                  \
                T xv = xp[c]; const T *wr = wp + c * g->O;                          \
                for (int64_t o = 0; o < g->O; o++) yp[o] += xv * wr[o];             \
              }                                                                     \
            }                                                                       \
          }                                                                         \
        });                                                                         \
  } while (0)

/* dx (N,H,W,C) = the transpose of conv applied to dy (N,OH,OW,O); one image per thread */
#define CONV_BWD_INPUT(T) do {                                                      \
    const T *DY = (const T *)dy, *Wt = (const T *)w; T *DX = (T *)dx;               \
    MG_PARALLEL_FOR(out_numel(g) * g->C * g->KH * g->KW > 65536, ,                  \
    for (int64_t n = 0; n < g->N; n++) {                                            \
      T *dxn = DX + n * g->H * g->W * g->C;                                         \
      for (int64_t i = 0; i < g->H * g->W * g->C; i++) dxn[i] = 0;                  \
      for (int64_t oh = 0; oh < g->OH; oh++)                                        \
        for (int64_t ow = 0; ow < g->OW; ow++) {                                    \
          const T *dyp = DY + ((n * g->OH + oh) * g->OW + ow) * g->O;               \
          for (int64_t u = 0; u < g->KH; u++) {                                     \
            int64_t ih = oh * g->sh + u * g->dh - g->pt;                            \
            if (ih < 0 || ih >= g->H) continue;                                     \
            for (int64_t v = 0; v < g->KW; v++) {                                   \
              int64_t iw = ow * g->sw + v * g->dw - g->pl;                          \
              if (iw < 0 || iw >= g->W) continue;                                   \
              T *dxp = dxn + (ih * g->W + iw) * g->C;                               \
              const T *wp = Wt + (u * g->KW + v) * g->C * g->O;                     \
              for (int64_t c = 0; c < g->C; c++) {                                  \
                const T *wr = wp + c * g->O; T s = 0;                               \
                for (int64_t o = 0; o < g->O; o++) s += wr[o] * dyp[o];             \
                dxp[c] += s;                                                        \
              }                                                                     \
            }                                                                       \
          }                                                                         \
        }                                                                           \
    });                                                                             \
  } while (0)

/* dw (KH,KW,C,O) = sum over n, oh, ow of x (the tap's pixel) outer dy; one tap per thread */
#define CONV_BWD_FILTER(T) do {                                                     \
    const T *X = (const T *)x, *DY = (const T *)dy; T *DW = (T *)dw;                \
    MG_PARALLEL_FOR(out_numel(g) * g->C * g->KH * g->KW > 65536, ,                  \
    for (int64_t uv = 0; uv < g->KH * g->KW; uv++) {                                \
      int64_t u = uv / g->KW, v = uv % g->KW;                                       \
      T *dwp = DW + uv * g->C * g->O;                                               \
      for (int64_t i = 0; i < g->C * g->O; i++) dwp[i] = 0;                         \
      for (int64_t n = 0; n < g->N; n++)                                            \
        for (int64_t oh = 0; oh < g->OH; oh++) {                                    \
          int64_t ih = oh * g->sh + u * g->dh - g->pt;                              \
          if (ih < 0 || ih >= g->H) continue;                                       \
          for (int64_t ow = 0; ow < g->OW; ow++) {                                  \
            int64_t iw = ow * g->sw + v * g->dw - g->pl;                            \
            if (iw < 0 || iw >= g->W) continue;                                     \
            const T *xp = X + ((n * g->H + ih) * g->W + iw) * g->C;                 \
            const T *dyp = DY + ((n * g->OH + oh) * g->OW + ow) * g->O;             \
            for (int64_t c = 0; c < g->C; c++) {                                    \
              T xv = xp[c]; T *dr = dwp + c * g->O;                                 \
              for (int64_t o = 0; o < g->O; o++) dr[o] += xv * dyp[o];              \
            }                                                                       \
          }                                                                         \
        }                                                                           \
    });                                                                             \
  } while (0)

/* the window of output (oh, ow): its rows [u0, u1) and columns [v0, v1) in
** taps, clipped to the image */
#define WINDOW(g, oh, ow)                                                           \
  int64_t ih0 = (oh) * (g)->sh - (g)->pt, iw0 = (ow) * (g)->sw - (g)->pl;           \
  int64_t u0 = ih0 >= 0 ? 0 : (-ih0 + (g)->dh - 1) / (g)->dh;                       \
  int64_t v0 = iw0 >= 0 ? 0 : (-iw0 + (g)->dw - 1) / (g)->dw;                       \
  int64_t u1 = (g)->KH, v1 = (g)->KW;                                               \
  while (u1 > u0 && ih0 + (u1 - 1) * (g)->dh >= (g)->H) u1--;                       \
  while (v1 > v0 && iw0 + (v1 - 1) * (g)->dw >= (g)->W) v1--

/* do the pool's windows tile the image (each pixel in one window at most)? */
static bool pool_tiles (const geom *g) {
  return g->sh == g->KH && g->sw == g->KW && g->dh == 1 && g->dw == 1 && g->pt == 0 && g->pl == 0 &&
         g->OH * g->KH <= g->H && g->OW * g->KW <= g->W;
}

/* the value of an element, for comparing: float32 and float64 as they are,
** bfloat16 bits widened (exactly) to float32; max pooling moves the bits */
#define AS_IS(v) (v)

/* does a window's value a take the maximum from m? A greater one does, and
** a NaN does (the maximum of a window with a NaN is NaN, as mg.max's and
** PyTorch's; the last NaN takes the gradient, as in PyTorch) */
#define BEATS(a, m) (((a) > (m)) | ((a) != (a)))   /* | not ||: no branch, the loops vectorise */

/* y (N,OH,OW,C) = the maximum over each window's pixels (max, as a blend,
** vectorises across the channels) */
#define MAX_POOL_FWD(T, V) do {                                                        \
    const T *X = (const T *)x; T *Y = (T *)y;                                       \
    const int64_t C = g->C;                                                         \
    MG_PARALLEL_FOR(out_numel(g) * g->KH * g->KW > 65536, collapse(2),              \
    for (int64_t n = 0; n < g->N; n++)                                              \
      for (int64_t oh = 0; oh < g->OH; oh++)                                        \
        for (int64_t ow = 0; ow < g->OW; ow++) {                                    \
          WINDOW(g, oh, ow);                                                        \
          T *restrict yp = Y + ((n * g->OH + oh) * g->OW + ow) * C;                 \
          const T *xn = X + n * g->H * g->W * C;                                    \
          for (int64_t u = u0; u < u1; u++)                                         \
            for (int64_t v = v0; v < v1; v++) {                                     \
              const T *restrict xp = xn + ((ih0 + u * g->dh) * g->W + iw0 + v * g->dw) * C; \
              if (u == u0 && v == v0) { for (int64_t c = 0; c < C; c++) yp[c] = xp[c]; } \
              else { for (int64_t c = 0; c < C; c++) yp[c] = BEATS(V(xp[c]), V(yp[c])) ? xp[c] : yp[c]; } \
            }                                                                       \
        });                                                                         \
  } while (0)

/* dx (N,H,W,C): each dy added at its window's first maximum in x; one
** image per thread, which keeps per channel the best value m and its tap k
** (in scratch: a slice of each per thread, 64-byte aligned so that threads
** share no cache line: sharing one made 2 threads 4x slower). When the windows tile the image
** (stride = window, no dilation, every window inside it) every pixel of dx
** is written once, dy or 0, with no zeroing pass; otherwise dx is zeroed
** and added to. "Inside" matters: "same" padding pads at the bottom and
** right (pt = pl = 0, pb or pr > 0), and there the tiled loop would write
** each window's clipped taps past the image, past dx's end. bfloat16 comes
** here tiled only (its sums would round; max_pool_bwd_g widens the others). */
#define MAX_POOL_BWD(T, CT, V) do {                                                    \
    const T *X = (const T *)x, *DY = (const T *)dy; T *DX = (T *)dx;                \
    const int64_t C = g->C, HWC = g->H * g->W * C;                                  \
    const bool tiled = pool_tiles(g);                                             \
    MG_PARALLEL(nthreads > 1, num_threads(nthreads),                                \
    {                                                                               \
      char *mine = (char *)scratch + (size_t)omp_get_thread_num() * 2 * slice;     \
      CT *restrict m = (CT *)mine;          /* each channel's best, as compared */  \
      int32_t *restrict k = (int32_t *)(mine + slice);                              \
      _Pragma("omp for")                                                            \
      for (int64_t n = 0; n < g->N; n++) {                                          \
        T *dxn = DX + n * HWC;                                                      \
        const T *xn = X + n * HWC;                                                  \
        if (tiled) {                    /* the rows and columns no window covers */ \
          for (int64_t i = g->OH * g->KH * g->W * C; i < HWC; i++) dxn[i] = 0;      \
          for (int64_t r = 0; r < g->OH * g->KH && g->OW * g->KW < g->W; r++)       \
            for (int64_t i = (r * g->W + g->OW * g->KW) * C; i < (r + 1) * g->W * C; i++) dxn[i] = 0; \
        } else {                                                                    \
          for (int64_t i = 0; i < HWC; i++) dxn[i] = 0;                             \
        }                                                                           \
        for (int64_t oh = 0; oh < g->OH; oh++)                                      \
          for (int64_t ow = 0; ow < g->OW; ow++) {                                  \
            WINDOW(g, oh, ow);                                                      \
            int64_t origin = (ih0 * g->W + iw0) * C;                                \
            for (int64_t u = u0; u < u1; u++)                                       \
              for (int64_t v = v0; v < v1; v++) {                                   \
                int32_t tap = (int32_t)(u * g->KW + v);                             \
                const T *restrict xp = xn + origin + toff[tap];                     \
                if (u == u0 && v == v0) {                                           \
                  for (int64_t c = 0; c < C; c++) { m[c] = V(xp[c]); k[c] = tap; }  \
                } else {                                                            \
                  for (int64_t c = 0; c < C; c++) {                                 \
                    CT val = V(xp[c]);                                              \
                    bool gt = BEATS(val, m[c]);                                     \
                    m[c] = gt ? val : m[c];                                         \
                    k[c] = gt ? tap : k[c];                                         \
                  }                                                                 \
                }                                                                   \
              }                                                                     \
            const T *restrict dyp = DY + ((n * g->OH + oh) * g->OW + ow) * C;       \
            if (tiled) {                                                            \
              for (int32_t tap = 0; tap < (int32_t)(g->KH * g->KW); tap++) {        \
                T *restrict dxp = dxn + origin + toff[tap];                         \
                for (int64_t c = 0; c < C; c++) dxp[c] = k[c] == tap ? dyp[c] : 0;  \
              }                                                                     \
            } else {                                                                \
              for (int64_t c = 0; c < C; c++) dxn[origin + toff[k[c]] + c] += dyp[c]; \
            }                                                                       \
          }                                                                         \
      }                                                                             \
    });                                                                             \
  } while (0)

/* The 2x2 windows of stride 2 most networks pool with, as one pass over the
** channels: the four taps' values side by side in registers (the general
** loops above keep a best value and tap per channel in memory and pass over
** the channels once per tap). Same selection: the first maximum in tap order,
** a NaN beating all. Only where the windows tile the image (pool_tiles). */
#define MAX_POOL2_FWD(T, V) do {                                                       \
    const T *X = (const T *)x; T *Y = (T *)y;                                       \
    const int64_t C = g->C, WC = g->W * C;                                          \
    MG_PARALLEL_FOR(out_numel(g) * 4 > 65536, collapse(2),                          \
    for (int64_t n = 0; n < g->N; n++)                                              \
      for (int64_t oh = 0; oh < g->OH; oh++)                                        \
        for (int64_t ow = 0; ow < g->OW; ow++) {                                    \
          const T *restrict p0 = X + n * g->H * WC + 2 * oh * WC + 2 * ow * C;      \
          const T *restrict p1 = p0 + C, *restrict p2 = p0 + WC, *restrict p3 = p2 + C; \
          T *restrict yp = Y + ((n * g->OH + oh) * g->OW + ow) * C;                 \
          for (int64_t c = 0; c < C; c++) {                                         \
            T m = p0[c];                                                            \
            m = BEATS(V(p1[c]), V(m)) ? p1[c] : m;                                  \
            m = BEATS(V(p2[c]), V(m)) ? p2[c] : m;                                  \
            yp[c] = BEATS(V(p3[c]), V(m)) ? p3[c] : m;                              \
          }                                                                         \
        });                                                                         \
  } while (0)

/* dx: dy at each window's first maximum (the last tap to beat the ones
** before it), 0 at its other three pixels and at the rows and columns no
** window covers; the selection as masks on the bits, so that it vectorises */
/* one window's C channels; restrict as parameters, where the vectoriser
** believes it (on pointers declared inside the parallel loop it did not) */
#define MAX_POOL2_WINDOW(NAME, T, UT, CT, V)                                          \
  static void NAME (int64_t C, const T *restrict p0, const T *restrict p1, const T *restrict p2, \
                    const T *restrict p3, const T *restrict dyp, T *restrict d0, T *restrict d1, \
                    T *restrict d2, T *restrict d3) {                               \
    for (int64_t c = 0; c < C; c++) {                                               \
      CT m = V(p0[c]), v1 = V(p1[c]), v2 = V(p2[c]), v3 = V(p3[c]);                 \
      UT g1 = BEATS(v1, m);                                                         \
      m = g1 ? v1 : m;                                                              \
      UT g2 = BEATS(v2, m);                                                         \
      m = g2 ? v2 : m;                                                              \
      UT g3 = BEATS(v3, m), d, o;                                                   \
      /* all-ones masks: dy's bits go to the last tap that beat the ones before */  \
      UT m3 = -g3, m2 = -g2 & ~m3, m1 = -g1 & ~(m2 | m3), m0 = ~(m1 | m2 | m3);     \
      memcpy(&d, dyp + c, sizeof d);                                                \
      o = d & m0; memcpy(d0 + c, &o, sizeof o);                                     \
      o = d & m1; memcpy(d1 + c, &o, sizeof o);                                     \
      o = d & m2; memcpy(d2 + c, &o, sizeof o);                                     \
      o = d & m3; memcpy(d3 + c, &o, sizeof o);                                     \
    }                                                                               \
  }
MAX_POOL2_WINDOW(pool2_window_f32, float, uint32_t, float, AS_IS)
MAX_POOL2_WINDOW(pool2_window_bf16, uint16_t, uint16_t, float, mg_bf16_value)
MAX_POOL2_WINDOW(pool2_window_f64, double, uint64_t, double, AS_IS)

#define MAX_POOL2_BWD(T, WINDOW_FN) do {                                               \
    const T *X = (const T *)x, *DY = (const T *)dy; T *DX = (T *)dx;                \
    const int64_t C = g->C, WC = g->W * C, HWC = g->H * WC;                         \
    MG_PARALLEL_FOR(out_numel(g) * 4 > 65536, ,                                     \
    for (int64_t n = 0; n < g->N; n++) {                                            \
      T *dxn = DX + n * HWC;                                                        \
      for (int64_t i = 2 * g->OH * WC; i < HWC; i++) dxn[i] = 0;                    \
      for (int64_t r = 0; r < 2 * g->OH && 2 * g->OW < g->W; r++)                   \
        for (int64_t i = r * WC + 2 * g->OW * C; i < (r + 1) * WC; i++) dxn[i] = 0; \
      for (int64_t oh = 0; oh < g->OH; oh++)                                        \
        for (int64_t ow = 0; ow < g->OW; ow++) {                                    \
          int64_t at = 2 * oh * WC + 2 * ow * C;                                    \
          const T *xw = X + n * HWC + at;                                           \
          T *dw = dxn + at;                                                         \
          WINDOW_FN(C, xw, xw + C, xw + WC, xw + WC + C, DY + ((n * g->OH + oh) * g->OW + ow) * C, \
                    dw, dw + C, dw + WC, dw + WC + C);                              \
        }                                                                           \
    });                                                                             \
  } while (0)

/* y (N,OH,OW,C) = the mean over each window's pixels in x (padding not counted) */
#define AVG_POOL_FWD(T) do {                                                        \
    const T *X = (const T *)x; T *Y = (T *)y;                                       \
    MG_PARALLEL_FOR(out_numel(g) * g->KH * g->KW > 65536, collapse(2),              \
    for (int64_t n = 0; n < g->N; n++)                                              \
      for (int64_t oh = 0; oh < g->OH; oh++)                                        \
        for (int64_t ow = 0; ow < g->OW; ow++) {                                    \
          WINDOW(g, oh, ow);                                                        \
          T *yp = Y + ((n * g->OH + oh) * g->OW + ow) * g->C;                       \
          T share = (T)1 / (T)((u1 - u0) * (v1 - v0));                              \
          for (int64_t c = 0; c < g->C; c++) yp[c] = 0;                             \
          for (int64_t u = u0; u < u1; u++)                                         \
            for (int64_t v = v0; v < v1; v++) {                                     \
              const T *xp = X + ((n * g->H + ih0 + u * g->dh) * g->W + iw0 + v * g->dw) * g->C; \
              for (int64_t c = 0; c < g->C; c++) yp[c] += xp[c];                    \
            }                                                                       \
          for (int64_t c = 0; c < g->C; c++) yp[c] *= share;                        \
        });                                                                         \
  } while (0)

/* dx (N,H,W,C): each dy shared evenly among its window's pixels; one image per thread */
#define AVG_POOL_BWD(T) do {                                                        \
    const T *DY = (const T *)dy; T *DX = (T *)dx;                                   \
    MG_PARALLEL_FOR(out_numel(g) * g->KH * g->KW > 65536, ,                         \
    for (int64_t n = 0; n < g->N; n++) {                                            \
      T *dxn = DX + n * g->H * g->W * g->C;                                         \
      for (int64_t i = 0; i < g->H * g->W * g->C; i++) dxn[i] = 0;                  \
      for (int64_t oh = 0; oh < g->OH; oh++)                                        \
        for (int64_t ow = 0; ow < g->OW; ow++) {                                    \
          WINDOW(g, oh, ow);                                                        \
          const T *dyp = DY + ((n * g->OH + oh) * g->OW + ow) * g->C;               \
          T share = (T)1 / (T)((u1 - u0) * (v1 - v0));                              \
          for (int64_t u = u0; u < u1; u++)                                         \
            for (int64_t v = v0; v < v1; v++) {                                     \
              T *dxp = dxn + ((ih0 + u * g->dh) * g->W + iw0 + v * g->dw) * g->C;   \
              for (int64_t c = 0; c < g->C; c++) dxp[c] += dyp[c] * share;          \
            }                                                                       \
        }                                                                           \
    });                                                                             \
  } while (0)

static void conv_fwd_ref (const geom *g, mg_dtype dt, const void *x, const void *w, const void *b, void *y) {
  if (dt == MG_FLOAT32) CONV_FWD(float); else CONV_FWD(double);
}
static void conv_bwd_input_ref (const geom *g, mg_dtype dt, const void *dy, const void *w, void *dx) {
  if (dt == MG_FLOAT32) CONV_BWD_INPUT(float); else CONV_BWD_INPUT(double);
}
static void conv_bwd_filter_ref (const geom *g, mg_dtype dt, const void *x, const void *dy, void *dw) {
  if (dt == MG_FLOAT32) CONV_BWD_FILTER(float); else CONV_BWD_FILTER(double);
}
/* the 2x2, stride-2 windows that tile the image (MAX_POOL2_FWD's case) */
static bool pool_2x2 (const geom *g) { return g->KH == 2 && g->KW == 2 && pool_tiles(g); }

static void pool_fwd_ref (const geom *g, mg_dtype dt, bool is_max, const void *x, void *y) {
  if (is_max && pool_2x2(g)) {
    if (dt == MG_FLOAT32) MAX_POOL2_FWD(float, AS_IS);
    else if (dt == MG_BFLOAT16) MAX_POOL2_FWD(uint16_t, mg_bf16_value);
    else MAX_POOL2_FWD(double, AS_IS);
  }
  else if (is_max) {
    if (dt == MG_FLOAT32) MAX_POOL_FWD(float, AS_IS);
    else if (dt == MG_BFLOAT16) MAX_POOL_FWD(uint16_t, mg_bf16_value);
    else MAX_POOL_FWD(double, AS_IS);
  }
  else { if (dt == MG_FLOAT32) AVG_POOL_FWD(float); else AVG_POOL_FWD(double); }
}
static mg_status pool_bwd_ref (const char *fn, const geom *g, mg_dtype dt, bool is_max, const void *x,
                               const void *dy, void *dx) {
  if (!is_max) {
    if (dt == MG_FLOAT32) AVG_POOL_BWD(float); else AVG_POOL_BWD(double);
    return MG_OK;
  }
  if (pool_2x2(g)) {
    if (dt == MG_FLOAT32) MAX_POOL2_BWD(float, pool2_window_f32);
    else if (dt == MG_BFLOAT16) MAX_POOL2_BWD(uint16_t, pool2_window_bf16);
    else MAX_POOL2_BWD(double, pool2_window_f64);
    return MG_OK;
  }
  int nthreads = out_numel(g) * g->KH * g->KW > 65536 ? omp_get_max_threads() : 1;
  int64_t taps = g->KH * g->KW;
  if (taps > INT32_MAX) return mg_seterror("%s: the window has too many pixels", fn);
  /* the taps' offsets from a window's corner; per thread, C values and C taps */
  size_t slice = ((size_t)g->C * sizeof(double) + 63) & ~(size_t)63;
  int64_t *toff = (int64_t *)malloc(sizeof(int64_t) * (size_t)taps);
  void *scratch = NULL;
  if (toff == NULL || posix_memalign(&scratch, 64, (size_t)nthreads * 2 * slice + 64) != 0) {
    free(toff);
    return mg_seterror("%s: out of memory", fn);
  }
  for (int64_t u = 0; u < g->KH; u++)
    for (int64_t v = 0; v < g->KW; v++) toff[u * g->KW + v] = (u * g->dh * g->W + v * g->dw) * g->C;
  if (dt == MG_FLOAT32) MAX_POOL_BWD(float, float, AS_IS);
  else if (dt == MG_BFLOAT16) MAX_POOL_BWD(uint16_t, float, mg_bf16_value);
  else MAX_POOL_BWD(double, double, AS_IS);
  free(scratch);
  free(toff);
  return MG_OK;
}

/* idx (N, OH*OW, C), int64: where in x, as ih*W + iw, each window's first
** maximum is (max_pool2d_backward's gradient takes dout there) */
#define POOL_ARGMAX(T) do {                                                         \
    const T *X = (const T *)mg_ptr(xc);                                             \
    for (int64_t n = 0; n < g->N; n++)                                              \
      for (int64_t oh = 0; oh < g->OH; oh++)                                        \
        for (int64_t ow = 0; ow < g->OW; ow++) {                                    \
          WINDOW(g, oh, ow);                                                        \
          int64_t *ip = I + ((n * g->OH + oh) * g->OW + ow) * g->C;                 \
          const T *xn = X + n * g->H * g->W * g->C;                                 \
          for (int64_t c = 0; c < g->C; c++) {                                      \
            int64_t best = -1; T m = -(T)INFINITY;                                  \
            for (int64_t u = u0; u < u1; u++)                                       \
              for (int64_t v = v0; v < v1; v++) {                                   \
                int64_t pix = (ih0 + u * g->dh) * g->W + iw0 + v * g->dw;           \
                if (best < 0 || BEATS(xn[pix * g->C + c], m)) { m = xn[pix * g->C + c]; best = pix; } \
              }                                                                     \
            ip[c] = best;                                                           \
          }                                                                         \
        }                                                                           \
  } while (0)

static mg_tensor *pool_argmax (const geom *g, mg_tensor *x) {
  int64_t shape[3] = {g->N, g->OH * g->OW, g->C};
  mg_tensor *xc = x->dtype == MG_BFLOAT16 ? mg_half_to_float32(x) : mg_contiguous(x);
  mg_tensor *idx = xc ? mg_empty(shape, 3, MG_INT64) : NULL;
  if (idx != NULL) {
    int64_t *I = (int64_t *)mg_ptr(idx);
    if (xc->dtype == MG_FLOAT32) POOL_ARGMAX(float); else POOL_ARGMAX(double);
  }
  mg_tensor_release(xc);
  return idx;
}

/* }============================================================= */


/* {================== oneDNN, one state per thread ================= */

typedef struct pkey {               /* compared with memcmp: no padding bytes */
  int32_t kind, bias, nthr, dt;     /* what (MG_DNN_CONV_FWD ...), with a bias, for how many threads, in which dtype */
  int32_t act, unused;              /* a forward's activation, as oneDNN's post-op (MG_ACT_LINEAR: none) */
  geom g;
} pkey;
_Static_assert(sizeof(pkey) == 6 * sizeof(int32_t) + sizeof(geom), "conv.c: pkey has padding");
_Static_assert(sizeof(pkey) <= MG_DNN_KEY_BYTES, "conv.c: pkey is longer than dnn.h's keys");

static void key_init (pkey *k, int kind, bool bias, const geom *g, mg_dtype dt, mg_activation act) {
  memset(k, 0, sizeof *k);
  k->kind = kind;
  k->bias = bias;
  k->dt = dt;
  k->act = act;
  k->nthr = omp_get_max_threads();
  k->g = *g;
}

/* Finishes e (e->pd made): the primitive, kept under key, and a reorder
** of the filters between HWIO and the layout wmd (NULL: none) the
** primitive wants; to_prim says which way. */
static dnnl_status_t prim_finish (mg_dnn *d, mg_dnn_prim *e, const pkey *key, const dnnl_memory_desc_t *hwio,
                                  const dnnl_memory_desc_t *wmd, bool to_prim) {
  if (wmd != NULL && !dnnl_memory_desc_equal(hwio, wmd)) {
    e->wbytes = dnnl_memory_desc_get_size(wmd);
    const dnnl_memory_desc_t *from = to_prim ? hwio : wmd, *to = to_prim ? wmd : hwio;
    dnnl_status_t st = dnnl_reorder_primitive_desc_create(&e->wpd, from, d->engine, to, d->engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&e->wp, e->wpd);
    if (st != dnnl_success) return st;
  }
  return mg_dnn_finish(d, e, key, sizeof *key);
}

/* a forward's activation as oneDNN's post-op on the float32 sum: for relu
** that is exact (it commutes with rounding), for tanh and sigmoid
** (bfloat16 outputs only) one rounding of oneDNN's own functions */
static dnnl_status_t activation_post_op (dnnl_primitive_attr_t attr, mg_activation act) {
  dnnl_alg_kind_t alg = act == MG_ACT_RELU ? dnnl_eltwise_relu : act == MG_ACT_TANH ? dnnl_eltwise_tanh
                                                                                  : dnnl_eltwise_logistic;
  dnnl_post_ops_t po;
  dnnl_status_t st = dnnl_post_ops_create(&po);
  if (st != dnnl_success) return st;
  st = dnnl_post_ops_append_eltwise(po, 1.0f, alg, 0.0f, 0.0f);
  if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, po);
  dnnl_post_ops_destroy(po);
  return st;
}

/* the primitive of `kind` for geometry g: from the cache, or made; NULL +
** error (*unimplemented set when oneDNN has no implementation for it) */
static mg_dnn_prim *conv_prim (const char *fn, mg_dnn *d, int kind, const geom *g, bool bias, mg_dtype dt,
                               mg_activation act, bool *unimplemented) {
  pkey key;
  key_init(&key, kind, bias, g, dt, act);
  mg_dnn_prim *e = mg_dnn_find(d, &key, sizeof key);
  if (e) return e;
  mg_dnn_slot(d, 1);                             /* room for this one and its hint */
  mg_dnn_prim *hint = kind == MG_DNN_CONV_FWD ? NULL : conv_prim(fn, d, MG_DNN_CONV_FWD, g, bias, dt, MG_ACT_LINEAR,
                                                                          unimplemented);
  if (kind != MG_DNN_CONV_FWD && hint == NULL) return NULL;
  dnnl_memory_desc_t src, wei, bia, dst, hwio;
  dnnl_dims_t sd = {g->N, g->C, g->H, g->W}, wd = {g->O, g->C, g->KH, g->KW}, bd = {g->O};
  dnnl_dims_t dd = {g->N, g->O, g->OH, g->OW};
  dnnl_dims_t strides = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1};
  dnnl_dims_t padl = {g->pt, g->pl}, padr = {g->pb, g->pr};
  /* bfloat16 images and filters (autocast's) accumulate in float32 inside
  ** oneDNN; a bias is always float32 */
  dnnl_data_type_t t = dt == MG_BFLOAT16 ? dnnl_bf16 : dnnl_f32;
  dnnl_memory_desc_init_by_tag(&src, 4, sd, t, dnnl_nhwc);
  dnnl_memory_desc_init_by_tag(&wei, 4, wd, t, dnnl_format_tag_any);
  dnnl_memory_desc_init_by_tag(&hwio, 4, wd, t, dnnl_hwio);
  dnnl_memory_desc_init_by_tag(&bia, 1, bd, dnnl_f32, dnnl_x);
  dnnl_memory_desc_init_by_tag(&dst, 4, dd, t, dnnl_nhwc);
  dnnl_convolution_desc_t cd;
  dnnl_status_t st;
  if (kind == MG_DNN_CONV_FWD)
    st = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &src,
                                                    &wei, bias ? &bia : NULL, &dst, strides, dil, padl, padr);
  else if (kind == MG_DNN_CONV_BWD_DATA)
    st = dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &src, &wei, &dst,
                                                          strides, dil, padl, padr);
  else
    st = dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &src, &wei, NULL,
                                                             &dst, strides, dil, padl, padr);
  dnnl_primitive_attr_t attr = mg_dnn_user_scratchpad();
  if (st == dnnl_success && attr && act != MG_ACT_LINEAR) st = activation_post_op(attr, act);
  e = mg_dnn_slot(d, 0);
  if (st == dnnl_success) st = attr ? dnnl_primitive_desc_create(&e->pd, &cd, attr, d->engine, hint ? hint->pd : NULL)
                                    : dnnl_out_of_memory;
  dnnl_primitive_attr_destroy(attr);
  if (st == dnnl_success) {
    dnnl_query_t q = kind == MG_DNN_CONV_BWD_WEIGHTS ? dnnl_query_diff_weights_md : dnnl_query_weights_md;
    st = prim_finish(d, e, &key, &hwio, dnnl_primitive_desc_query_md(e->pd, q, 0),
                     kind != MG_DNN_CONV_BWD_WEIGHTS);
  }
  if (st != dnnl_success) {
    *unimplemented = st == dnnl_unimplemented;
    mg_dnn_destroy(e);
    return mg_dnn_fail(fn, "make a convolution", st), NULL;
  }
  return e;
}

/* mean pooling, excluding padding (TensorFlow's SAME) */
static mg_dnn_prim *pool_prim (const char *fn, mg_dnn *d, int kind, const geom *g, bool *unimplemented) {
  const dnnl_alg_kind_t alg = dnnl_pooling_avg_exclude_padding;
  pkey key;
  key_init(&key, kind, false, g, MG_FLOAT32, MG_ACT_LINEAR);
  mg_dnn_prim *e = mg_dnn_find(d, &key, sizeof key);
  if (e) return e;
  mg_dnn_slot(d, 1);
  mg_dnn_prim *hint = kind == MG_DNN_POOL_BWD ? pool_prim(fn, d, MG_DNN_POOL_FWD, g, unimplemented) : NULL;
  if (kind == MG_DNN_POOL_BWD && hint == NULL) return NULL;
  dnnl_memory_desc_t src, dst;
  dnnl_dims_t sd = {g->N, g->C, g->H, g->W}, dd = {g->N, g->C, g->OH, g->OW};
  dnnl_dims_t strides = {g->sh, g->sw}, kernel = {g->KH, g->KW}, dil = {g->dh - 1, g->dw - 1};
  dnnl_dims_t padl = {g->pt, g->pl}, padr = {g->pb, g->pr};
  dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, dnnl_nhwc);
  dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, dnnl_nhwc);
  dnnl_pooling_v2_desc_t pdesc;
  dnnl_status_t st;
  if (kind == MG_DNN_POOL_BWD)
    st = dnnl_pooling_v2_backward_desc_init(&pdesc, alg, &src, &dst, strides, kernel, dil, padl, padr);
  else
    st = dnnl_pooling_v2_forward_desc_init(&pdesc, dnnl_forward_training, alg, &src, &dst, strides, kernel, dil,
                                           padl, padr);
  dnnl_primitive_attr_t attr = mg_dnn_user_scratchpad();
  e = mg_dnn_slot(d, 0);
  if (st == dnnl_success) st = attr ? dnnl_primitive_desc_create(&e->pd, &pdesc, attr, d->engine, hint ? hint->pd : NULL)
                                    : dnnl_out_of_memory;
  dnnl_primitive_attr_destroy(attr);
  if (st == dnnl_success) st = prim_finish(d, e, &key, NULL, NULL, false);
  if (st != dnnl_success) {
    *unimplemented = st == dnnl_unimplemented;
    mg_dnn_destroy(e);
    return mg_dnn_fail(fn, "make a pooling", st), NULL;
  }
  return e;
}

/* the filters w (HWIO) as e's primitive wants them: w itself, or a copy
** in *tmp (to release) */
static void *filters_in (const char *fn, mg_dnn *d, mg_dnn_prim *e, const void *w, mg_storage **tmp) {
  *tmp = NULL;
  if (e->wp == NULL) return (void *)w;
  if ((*tmp = mg_storage_new(e->wbytes)) == NULL) return NULL;
  int args[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
  void *ptrs[2] = {(void *)w, (*tmp)->data};
  if (mg_dnn_execute(fn, d, e->wpd, e->wp, 0, 2, args, ptrs, e->wmem) != MG_OK) {
    mg_storage_release(*tmp);
    return *tmp = NULL;
  }
  return ptrs[1];
}

/* float32 on oneDNN; MG_ERR with *declined when it has no implementation */
static mg_status conv_fwd_dnnl (const char *fn, const geom *g, mg_dtype dt, const void *x, const void *w,
                                const void *b, void *y, mg_activation act, bool *declined) {
  mg_dnn *d = mg_dnn_get(fn);
  mg_dnn_prim *e = d ? conv_prim(fn, d, MG_DNN_CONV_FWD, g, b != NULL, dt, act, declined) : NULL;
  if (e == NULL) return MG_ERR;
  mg_storage *tmp;
  void *wp = filters_in(fn, d, e, w, &tmp);
  if (wp == NULL) return MG_ERR;
  int args[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
  void *ptrs[4] = {(void *)x, wp, y, (void *)b};
  mg_status st = mg_dnn_execute(fn, d, e->pd, e->p, e->scratch, b ? 4 : 3, args, ptrs, e->mem);
  mg_storage_release(tmp);
  return st;
}

static mg_status conv_bwd_input_dnnl (const char *fn, const geom *g, mg_dtype dt, const void *dy, const void *w,
                                      void *dx, bool *declined) {
  mg_dnn *d = mg_dnn_get(fn);
  mg_dnn_prim *e = d ? conv_prim(fn, d, MG_DNN_CONV_BWD_DATA, g, false, dt, MG_ACT_LINEAR, declined) : NULL;
  if (e == NULL) return MG_ERR;
  mg_storage *tmp;
  void *wp = filters_in(fn, d, e, w, &tmp);
  if (wp == NULL) return MG_ERR;
  int args[3] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
  void *ptrs[3] = {(void *)dy, wp, dx};
  mg_status st = mg_dnn_execute(fn, d, e->pd, e->p, e->scratch, 3, args, ptrs, e->mem);
  mg_storage_release(tmp);
  return st;
}

/* oneDNN's 1x1 backward-weights kernel for strides above 1 (jit_1x1 with
** its "reduce to unit stride" copy) writes past that copy's workspace when
** the input has fewer channels than its channel block (8 with AVX2, 16 with
** AVX-512) in NHWC (uxlfoundation/oneDNN#6035): wrong weight gradients that
** change from run to run, or a crash. Such filters are small (C below 16):
** this file's loops take them. */
static bool dnnl_1x1_strided_bug (const geom *g) {
  return g->KH == 1 && g->KW == 1 && (g->sh > 1 || g->sw > 1) && g->C < 16;
}

static mg_status conv_bwd_filter_dnnl (const char *fn, const geom *g, mg_dtype dt, const void *x, const void *dy,
                                       void *dw, bool *declined) {
  if (dnnl_1x1_strided_bug(g)) {
    *declined = true;
    return MG_ERR;
  }
  mg_dnn *d = mg_dnn_get(fn);
  mg_dnn_prim *e = d ? conv_prim(fn, d, MG_DNN_CONV_BWD_WEIGHTS, g, false, dt, MG_ACT_LINEAR, declined) : NULL;
  if (e == NULL) return MG_ERR;
  mg_storage *tmp = e->wp ? mg_storage_new(e->wbytes) : NULL;   /* the primitive's layout, then HWIO */
  if (e->wp && tmp == NULL) return MG_ERR;
  int args[3] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
  void *ptrs[3] = {(void *)x, (void *)dy, tmp ? tmp->data : dw};
  mg_status st = mg_dnn_execute(fn, d, e->pd, e->p, e->scratch, 3, args, ptrs, e->mem);
  if (st == MG_OK && tmp) {
    int rargs[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    void *rptrs[2] = {tmp->data, dw};
    st = mg_dnn_execute(fn, d, e->wpd, e->wp, 0, 2, rargs, rptrs, e->wmem);
  }
  mg_storage_release(tmp);
  return st;
}

/* mean pooling (max pooling is this file's own loop) */
static mg_status pool_fwd_dnnl (const char *fn, const geom *g, const void *x, void *y, bool *declined) {
  mg_dnn *d = mg_dnn_get(fn);
  mg_dnn_prim *e = d ? pool_prim(fn, d, MG_DNN_POOL_FWD, g, declined) : NULL;
  if (e == NULL) return MG_ERR;
  int args[2] = {DNNL_ARG_SRC, DNNL_ARG_DST};
  void *ptrs[2] = {(void *)x, y};
  return mg_dnn_execute(fn, d, e->pd, e->p, e->scratch, 2, args, ptrs, e->mem);
}

static mg_status pool_bwd_dnnl (const char *fn, const geom *g, const void *dy, void *dx, bool *declined) {
  mg_dnn *d = mg_dnn_get(fn);
  mg_dnn_prim *e = d ? pool_prim(fn, d, MG_DNN_POOL_BWD, g, declined) : NULL;
  if (e == NULL) return MG_ERR;
  int args[2] = {DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC};
  void *ptrs[2] = {(void *)dy, dx};
  return mg_dnn_execute(fn, d, e->pd, e->p, e->scratch, 2, args, ptrs, e->mem);
}

/* }============================================================= */


/* {========================= the kernels ========================= */
/* Each runs oneDNN for float32 (the reference loops when oneDNN declines,
** or when a size is 0) and the loops for float64. Buffers are contiguous. */

static bool use_dnnl (const geom *g, mg_dtype dt) {
  return (dt == MG_FLOAT32 || dt == MG_BFLOAT16) && g->N > 0 && g->C > 0 && g->O > 0 && g->OH > 0 && g->OW > 0;
}

/* the oneDNN call (which sets `declined`), else the loops when it declined */
#define DISPATCH(DNNL_CALL, REF_CALL) do {                                          \
    bool declined = false;                                                          \
    if (use_dnnl(g, dt)) {                                                          \
      if ((DNNL_CALL) == MG_OK) return MG_OK;                                       \
      if (!declined) return MG_ERR;                                                 \
    }                                                                               \
    REF_CALL;                                                                       \
    return MG_OK;                                                                   \
  } while (0)

/* this library's activation kernel over y in place, in blocks across the threads */
typedef struct { mg_kernel k; char *y; size_t esz; } act_ud;
static void act_block (const void *ctx, int64_t lo, int64_t hi) {
  const act_ud *a = (const act_ud *)ctx;
  char *p[2] = {a->y + (size_t)lo * a->esz, a->y + (size_t)lo * a->esz};
  int64_t s[2] = {1, 1};
  a->k(hi - lo, p, s);
}
static void activate (mg_dtype dt, void *y, int64_t n, mg_activation act) {
  act_ud a = {mg_activation_kernel(act, dt), (char *)y, mg_dtype_size(dt)};
  if (a.k) mg_for_blocks(n, act_block, &a);
}

/* float32 and float64: relu as oneDNN's post-op, other activations by this
** library's kernels after the sum (the numbers of the separate ops) */
static mg_status conv_fwd (const char *fn, const geom *g, mg_dtype dt, const void *x, const void *w,
                           const void *b, void *y, mg_activation act) {
  bool declined = false;
  mg_activation in_dnnl = act == MG_ACT_RELU ? act : MG_ACT_LINEAR;
  if (use_dnnl(g, dt)) {
    if (conv_fwd_dnnl(fn, g, dt, x, w, b, y, in_dnnl, &declined) == MG_OK) {
      if (in_dnnl != act) activate(dt, y, out_numel(g), act);
      return MG_OK;
    }
    if (!declined) return MG_ERR;
  }
  conv_fwd_ref(g, dt, x, w, b, y);
  activate(dt, y, out_numel(g), act);
  return MG_OK;
}

static mg_status conv_bwd_input (const char *fn, const geom *g, mg_dtype dt, const void *dy, const void *w,
                                 void *dx) {
  DISPATCH(conv_bwd_input_dnnl(fn, g, dt, dy, w, dx, &declined), conv_bwd_input_ref(g, dt, dy, w, dx));
}

static mg_status conv_bwd_filter (const char *fn, const geom *g, mg_dtype dt, const void *x, const void *dy,
                                  void *dw) {
  DISPATCH(conv_bwd_filter_dnnl(fn, g, dt, x, dy, dw, &declined), conv_bwd_filter_ref(g, dt, x, dy, dw));
}

/* max pooling is this file's own loop for both dtypes: oneDNN's (jit:avx2,
** NHWC) measured 2x slower forward and 3x backward, where it must run the
** forward again for its workspace; mean pooling is oneDNN's for float32 */
static mg_status pool_fwd (const char *fn, const geom *g, mg_dtype dt, bool is_max, const void *x, void *y) {
  if (is_max) {
    pool_fwd_ref(g, dt, true, x, y);
    return MG_OK;
  }
  DISPATCH(pool_fwd_dnnl(fn, g, x, y, &declined), pool_fwd_ref(g, dt, false, x, y));
}

static mg_status pool_bwd (const char *fn, const geom *g, mg_dtype dt, bool is_max, const void *x,
                           const void *dy, void *dx) {
  if (is_max) return pool_bwd_ref(fn, g, dt, true, x, dy, dx);
  DISPATCH(pool_bwd_dnnl(fn, g, dy, dx, &declined), pool_bwd_ref(fn, g, dt, false, NULL, dy, dx));
}

/* }============================================================= */


/* {=================== the ops, on a geometry ==================== */
/* The entry points check their arguments and make the geometry; these
** dispatch the op on it. Backward rules call them with the geometry their
** node kept. */

static const mg_opdef conv2d_op, conv2d_bi_op, conv2d_bf_op, max_pool_op, max_pool_bwd_op, avg_pool_op,
                      avg_pool_bwd_op;

/* runs op on geometry g (NULL entries of in[]: an absent bias, not an
** input) into a new tensor of `shape`, with g in its attributes */
static mg_tensor *run_op (const mg_opdef *op, const geom *g, int nin, mg_tensor *const *in,
                          const int64_t *shape, mg_activation act) {
  mg_attr attr;
  geom_to_attr(g, &attr);
  attr.c[1] = act;                                /* conv2d's activation (the others': linear) */
  int recorded = nin;                             /* an absent bias is not an input */
  while (recorded > 0 && in[recorded - 1] == NULL) recorded--;
  if (mg_shape_numel(op->info.name, shape, 4) < 0) return NULL;   /* the error names the op */
  mg_opcall c = MG_OPCALL(op, recorded, in, &attr, shape, 4, in[0]->dtype);
  c.local = g;
  return mg_dispatch(&c);
}

static mg_status conv_kernel (const mg_opdef *op, const geom *g, mg_dtype dt, void *const *p, void *out,
                              mg_activation act);
static mg_status pool_kernel (const mg_opdef *op, const geom *g, mg_dtype dt, void *const *p, void *out);

/* the kernel of every op here: contiguous copies of the inputs, then the
** convolution's or the pooling's (c->local: the geometry) */
static mg_status conv_family_forward (mg_opcall *c) {
  const mg_opdef *op = c->def;
  const geom *g = (const geom *)c->local;
  mg_dtype dt = c->dtype;
  mg_tensor *cc[3] = {NULL, NULL, NULL}, *out = mg_empty(c->shape, 4, dt);
  mg_status st = out ? MG_OK : MG_ERR;
  void *p[3] = {NULL, NULL, NULL};
  for (int j = 0; j < c->nin && st == MG_OK; j++) {
    if ((cc[j] = mg_contiguous(c->in[j])) == NULL) st = MG_ERR;
    else p[j] = mg_ptr(cc[j]);
  }
  bool conv = op == &conv2d_op || op == &conv2d_bi_op || op == &conv2d_bf_op;
  if (st == MG_OK && out->numel > 0)
    st = conv ? conv_kernel(op, g, dt, p, mg_ptr(out), (mg_activation)c->attr->c[1]) : pool_kernel(op, g, dt, p, mg_ptr(out));
  for (int j = 0; j < 3; j++) mg_tensor_release(cc[j]);
  if (st != MG_OK) {
    mg_tensor_release(out);
    return MG_ERR;
  }
  c->out[0] = out;
  return MG_OK;
}

/* a bfloat16 convolution oneDNN declines (or with an empty size): float32
** copies of the operands through the float32 kernel, the result rounded */
static mg_status conv_kernel_widened (const mg_opdef *op, const geom *g, void *const *p, void *out,
                                      mg_activation act) {
  int64_t x = g->N * g->H * g->W * g->C, w = g->KH * g->KW * g->C * g->O, y = g->N * g->OH * g->OW * g->O;
  int64_t n0 = op == &conv2d_bi_op ? y : x, n1 = op == &conv2d_bf_op ? y : w;
  int64_t nout = op == &conv2d_op ? y : op == &conv2d_bi_op ? x : w;
  mg_storage *a = mg_storage_new(sizeof(float) * (size_t)(n0 + n1 + nout) + 1);
  if (a == NULL) return MG_ERR;
  float *p0 = (float *)a->data, *p1 = p0 + n0, *po = p1 + n1;
  mg_convert(p0, MG_FLOAT32, p[0], MG_BFLOAT16, n0);
  mg_convert(p1, MG_FLOAT32, p[1], MG_BFLOAT16, n1);
  void *pf[3] = {p0, p1, p[2]};                 /* the bias is float32 already */
  mg_status st = conv_kernel(op, g, MG_FLOAT32, pf, po, act);
  if (st == MG_OK) mg_convert(out, MG_BFLOAT16, po, MG_FLOAT32, nout);
  mg_storage_release(a);
  return st;
}

/* act: conv2d's activation, on the float32 sum (a bfloat16 result rounds once) */
static mg_status conv_kernel (const mg_opdef *op, const geom *g, mg_dtype dt, void *const *p, void *out,
                              mg_activation act) {
  const char *fn = op->info.name;
  if (dt == MG_BFLOAT16) {
    bool declined = !use_dnnl(g, dt);
    mg_status st = MG_ERR;
    if (!declined && op == &conv2d_op) st = conv_fwd_dnnl(fn, g, dt, p[0], p[1], p[2], out, act, &declined);
    else if (!declined && op == &conv2d_bi_op) st = conv_bwd_input_dnnl(fn, g, dt, p[0], p[1], out, &declined);
    else if (!declined) st = conv_bwd_filter_dnnl(fn, g, dt, p[0], p[1], out, &declined);
    return st == MG_OK || !declined ? st : conv_kernel_widened(op, g, p, out, act);
  }
  if (op == &conv2d_op) return conv_fwd(fn, g, dt, p[0], p[1], p[2], out, act);
  if (op == &conv2d_bi_op) return conv_bwd_input(fn, g, dt, p[0], p[1], out);
  return conv_bwd_filter(fn, g, dt, p[0], p[1], out);
}

static mg_status pool_kernel (const mg_opdef *op, const geom *g, mg_dtype dt, void *const *p, void *out) {
  const char *fn = op->info.name;
  if (op == &max_pool_op) return pool_fwd(fn, g, dt, true, p[0], out);
  if (op == &avg_pool_op) return pool_fwd(fn, g, dt, false, p[0], out);
  if (op == &max_pool_bwd_op) return pool_bwd(fn, g, dt, true, p[0], p[1], out);
  return pool_bwd(fn, g, dt, false, NULL, p[0], out);
}

static void in_shape (const geom *g, int64_t *s) { s[0] = g->N; s[1] = g->H; s[2] = g->W; s[3] = g->C; }
static void out_shape (const geom *g, int64_t *s) { s[0] = g->N; s[1] = g->OH; s[2] = g->OW; s[3] = g->O; }

static mg_tensor *conv2d_g (const geom *g, mg_tensor *x, mg_tensor *w, mg_tensor *b, mg_activation act) {
  int64_t shape[4];
  out_shape(g, shape);
  mg_tensor *in[3] = {x, w, b};
  return run_op(&conv2d_op, g, 3, in, shape, act);
}

static mg_tensor *conv2d_bi_g (const geom *g, mg_tensor *dy, mg_tensor *w) {
  int64_t shape[4];
  in_shape(g, shape);
  mg_tensor *in[2] = {dy, w};
  return run_op(&conv2d_bi_op, g, 2, in, shape, MG_ACT_LINEAR);
}

static mg_tensor *conv2d_bf_g (const geom *g, mg_tensor *x, mg_tensor *dy) {
  int64_t shape[4] = {g->KH, g->KW, g->C, g->O};
  mg_tensor *in[2] = {x, dy};
  return run_op(&conv2d_bf_op, g, 2, in, shape, MG_ACT_LINEAR);
}

static mg_tensor *pool_g (const mg_opdef *op, const geom *g, mg_tensor *x) {
  int64_t shape[4];
  out_shape(g, shape);
  return run_op(op, g, 1, &x, shape, MG_ACT_LINEAR);
}

/* bfloat16 where each dy lands in one place (the windows tile the image),
** else float32 copies whose sums round once */
static mg_tensor *max_pool_bwd_g (const geom *g, mg_tensor *x, mg_tensor *dy) {
  int64_t shape[4];
  in_shape(g, shape);
  if (x->dtype == MG_BFLOAT16 && !pool_tiles(g)) {
    mg_scope sc = {0};
    mg_tensor *x32 = mg_tmp(&sc, mg_half_to_float32(x)), *dy32 = mg_tmp(&sc, mg_half_to_float32(dy));
    mg_tensor *dx = x32 && dy32 ? mg_tmp(&sc, max_pool_bwd_g(g, x32, dy32)) : NULL;
    mg_tensor *r = dx ? mg_cast(dx, MG_BFLOAT16) : NULL;
    mg_scope_end(&sc);
    return r;
  }
  mg_tensor *in[2] = {x, dy};
  return run_op(&max_pool_bwd_op, g, 2, in, shape, MG_ACT_LINEAR);
}

static mg_tensor *avg_pool_bwd_g (const geom *g, mg_tensor *dy) {
  int64_t shape[4];
  in_shape(g, shape);
  return run_op(&avg_pool_bwd_op, g, 1, &dy, shape, MG_ACT_LINEAR);
}

/* }============================================================= */


/* {======================== convolution ========================= */

/* the gradient at the sum, before the activation, in the dtype of the
** convolution (a bfloat16 one takes bfloat16 gradients) */
static mg_tensor *activation_gradient (mg_node *n, mg_activation act, mg_tensor *dout) {
  mg_tensor *y = n->out[0];
  if (act == MG_ACT_LINEAR) return mg_tensor_retain(dout);
  mg_tensor *g = mg_activation_backward(n, act, dout, y);
  if (g == NULL || g->dtype == n->in_meta[0].dtype) return g;
  mg_tensor *narrow = mg_cast(g, n->in_meta[0].dtype);   /* autocast's: tanh and sigmoid's gradients come in float32 */
  mg_tensor_release(g);
  return narrow;
}

/* conv2d: y = act(conv(x, w) + b).
** grad: g = the activation's gradient from y, then dx = backward_input(g, w),
** dw = backward_filter(x, g), db = sum of g over (N,OH,OW) */
static mg_status conv2d_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  geom g;
  geom_from_attr(&g, n->attr);
  mg_activation act = (mg_activation)n->attr->c[1];
  mg_tensor *d = activation_gradient(n, act, dout[0]);
  if (act != MG_ACT_LINEAR) mg_node_unkeep_out(n, 0);   /* y is done with: not held through the products */
  if (d == NULL) return MG_ERR;
  if (n->needs[0]) din[0] = conv2d_bi_g(&g, d, n->in[1]);
  if (n->needs[1]) din[1] = conv2d_bf_g(&g, n->in[0], d);
  if (n->nin == 3 && n->needs[2]) {
    int64_t rows2[2] = {g.N * g.OH * g.OW, g.O};
    mg_tensor *r = mg_reshape(d, rows2, 2);
    din[2] = mg_sum(r, 0, 0);
    mg_tensor_release(r);
  }
  mg_tensor_release(d);
  return MG_OK;
}

/* y for the activation's gradient, when there is one; x for w's, w for x's */
static unsigned conv2d_saves (const mg_attr *attr) {
  return attr->c[1] != MG_ACT_LINEAR ? MG_SAVE_OUT(0) : 0;
}
/* each output element: a filter's height x width x input channels */
static double conv2d_macs (const mg_node *n) {
  double c = 1;
  for (int d = 0; d < n->out_meta[0].ndim; d++) c *= (double)n->out_meta[0].shape[d];
  const mg_meta *w = &n->in_meta[1];
  return w->ndim == 4 ? c * (double)w->shape[0] * (double)w->shape[1] * (double)w->shape[2] : c;
}
MG_ROW(CONV2D, conv2d) = {
  .forward = conv_family_forward,
  .info = {.name = "conv2d", .kind = MG_OP_OTHER,
           .doc = "2-D convolution of NHWC images x with HWIO filters w, plus a bias, then an activation "
                  "(TensorFlow's conv2d; Keras' Conv2D in one op)",
           .product = 1},
  .macs = conv2d_macs, .saves_for = conv2d_saves, .grad_saves = {MG_SAVE_IN(1), MG_SAVE_IN(0)},
  .backward = conv2d_backward, .reuses_gradient = true,
};

static mg_tensor *conv2d_of (mg_tensor *x, mg_tensor *w, mg_tensor *b, const mg_conv_params *p,
                             mg_activation act);

mg_tensor *mg_conv2d (mg_tensor *x, mg_tensor *w, mg_tensor *b, const mg_conv_params *p) {
  return mg_conv2d_act(x, w, b, p, NULL);
}

mg_tensor *mg_conv2d_act (mg_tensor *x, mg_tensor *w, mg_tensor *b, const mg_conv_params *p,
                          const char *activation) {
  MG_CHECK_ARG("mg_conv2d", x, NULL);
  MG_CHECK_ARG("mg_conv2d", w, NULL);
  mg_activation act;
  if (mg_activation_parse("conv2d", activation, &act) != MG_OK) return NULL;
  /* under autocast: bfloat16 images and filters; a bias always adds in float32 */
  mg_tensor *xh = mg_autocast_operand(x), *wh = mg_autocast_operand(w);
  mg_tensor *b32 = b && mg_is_half(b->dtype) ? mg_half_to_float32(b) : mg_retain_or_null(b);
  mg_tensor *r = xh && wh && (b32 || !b) ? conv2d_of(xh, wh, b32, p, act) : NULL;
  mg_tensor_release(xh);
  mg_tensor_release(wh);
  mg_tensor_release(b32);
  return r;
}

static mg_tensor *conv2d_of (mg_tensor *x, mg_tensor *w, mg_tensor *b, const mg_conv_params *p,
                             mg_activation act) {
  const char *fn = "conv2d";
  char s1[160];
  if (check_image(fn, "input", "(N,H,W,C)", x) != MG_OK) return NULL;
  if (check_image(fn, "filters", "(KH,KW,Cin,Cout)", w) != MG_OK) return NULL;
  if (check_same_dtype(fn, "input", x, "filters", w) != MG_OK) return NULL;
  if (x->shape[3] != w->shape[2])
    return mg_seterror("%s: input has %lld channel%s, the filters expect %lld", fn, (long long)x->shape[3],
                       x->shape[3] == 1 ? "" : "s", (long long)w->shape[2]), NULL;
  if (b != NULL) {
    if (!(mg_is_half(x->dtype) && b->dtype == MG_FLOAT32) && check_same_dtype(fn, "input", x, "bias", b) != MG_OK)
      return NULL;
    if (b->ndim != 1 || b->shape[0] != w->shape[3])
      return mg_seterror("%s: bias has shape %s, the filters have %lld output channel%s (expected (%lld))", fn,
                         shape_s(s1, sizeof s1, b->shape, b->ndim), (long long)w->shape[3],
                         w->shape[3] == 1 ? "" : "s", (long long)w->shape[3]), NULL;
  }
  geom g;
  if (geom_init(fn, &g, x->shape, w->shape[0], w->shape[1], w->shape[3], p, false) != MG_OK) return NULL;
  FLOAT16_AS_FLOAT32(x, w, conv2d_of(x, w, b, p, act));      /* the bias: float32 already */
  return conv2d_g(&g, x, w, b, act);
}

/* conv2d_backward_input: dx = J^T dy, bilinear in (dy, w).
** grad: d(dy) = conv2d(dout, w), dw = backward_filter(dout, dy) */
static mg_status conv2d_bi_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  geom g;
  geom_from_attr(&g, n->attr);
  if (n->needs[0]) din[0] = conv2d_g(&g, dout[0], n->in[1], NULL, MG_ACT_LINEAR);
  if (n->needs[1]) din[1] = conv2d_bf_g(&g, dout[0], n->in[0]);
  return MG_OK;
}
MG_ROW(CONV2D_BI, conv2d_bi) = {
  .forward = conv_family_forward,
  .info = {.name = "conv2d_backward_input", .kind = MG_OP_OTHER,
           .doc = "conv2d's gradient with respect to its input (TensorFlow's conv2d_transpose)"},
  .saves = MG_SAVE_IN(0) | MG_SAVE_IN(1), .backward = conv2d_bi_backward,
};

/* the checks both backward entries make of dy against the geometry */
static mg_status check_dy (const char *fn, const mg_tensor *dy, const geom *g, const char *from) {
  char s1[160], s2[160];
  int64_t want[4];
  out_shape(g, want);
  if (mg_same_shape(dy->shape, 4, want, 4)) return MG_OK;
  return mg_seterror("%s: dy has shape %s, the convolution of %s gives %s", fn,
                     shape_s(s1, sizeof s1, dy->shape, 4), from, shape_s(s2, sizeof s2, want, 4));
}

static mg_tensor *backward_input_of (mg_tensor *dy, mg_tensor *w, const int64_t input_shape[4],
                                     const mg_conv_params *p);

mg_tensor *mg_conv2d_backward_input (mg_tensor *dy, mg_tensor *w, const int64_t input_shape[4],
                                     const mg_conv_params *p) {
  MG_CHECK_ARG("mg_conv2d_backward_input", dy, NULL);
  MG_CHECK_ARG("mg_conv2d_backward_input", w, NULL);
  /* under autocast: bfloat16, as conv2d's operands (PyTorch's conv_transpose2d is on its list) */
  AUTOCAST_PAIR(dy, w, backward_input_of(dy, w, input_shape, p));
}

static mg_tensor *backward_input_of (mg_tensor *dy, mg_tensor *w, const int64_t input_shape[4],
                                     const mg_conv_params *p) {
  const char *fn = "conv2d_backward_input";
  char s1[160], s2[200];
  if (check_image(fn, "dy", "(N,OH,OW,Cout)", dy) != MG_OK) return NULL;
  if (check_image(fn, "filters", "(KH,KW,Cin,Cout)", w) != MG_OK) return NULL;
  if (check_same_dtype(fn, "dy", dy, "filters", w) != MG_OK) return NULL;
  if (check_shape4(fn, "input_shape", input_shape) != MG_OK) return NULL;
  if (input_shape[3] != w->shape[2])
    return mg_seterror("%s: input_shape has %lld channels, the filters expect %lld", fn,
                       (long long)input_shape[3], (long long)w->shape[2]), NULL;
  geom g;
  if (geom_init(fn, &g, input_shape, w->shape[0], w->shape[1], w->shape[3], p, false) != MG_OK) return NULL;
  snprintf(s2, sizeof s2, "input_shape %s", shape_s(s1, sizeof s1, input_shape, 4));
  if (check_dy(fn, dy, &g, s2) != MG_OK) return NULL;
  FLOAT16_AS_FLOAT32(dy, w, backward_input_of(dy, w, input_shape, p));
  return conv2d_bi_g(&g, dy, w);
}

/* conv2d_backward_filter: dw = d<conv2d(x, w), dy>/dw, bilinear in (x, dy).
** grad: dx = backward_input(dy, dout), d(dy) = conv2d(x, dout) */
static mg_status conv2d_bf_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  geom g;
  geom_from_attr(&g, n->attr);
  if (n->needs[0]) din[0] = conv2d_bi_g(&g, n->in[1], dout[0]);
  if (n->needs[1]) din[1] = conv2d_g(&g, n->in[0], dout[0], NULL, MG_ACT_LINEAR);
  return MG_OK;
}
MG_ROW(CONV2D_BF, conv2d_bf) = {
  .forward = conv_family_forward,
  .info = {.name = "conv2d_backward_filter", .kind = MG_OP_OTHER,
           .doc = "conv2d's gradient with respect to its filters"},
  .saves = MG_SAVE_IN(0) | MG_SAVE_IN(1), .backward = conv2d_bf_backward,
};

static mg_tensor *backward_filter_of (mg_tensor *x, mg_tensor *dy, const int64_t filter_shape[4],
                                      const mg_conv_params *p);

mg_tensor *mg_conv2d_backward_filter (mg_tensor *x, mg_tensor *dy, const int64_t filter_shape[4],
                                      const mg_conv_params *p) {
  MG_CHECK_ARG("mg_conv2d_backward_filter", x, NULL);
  MG_CHECK_ARG("mg_conv2d_backward_filter", dy, NULL);
  AUTOCAST_PAIR(x, dy, backward_filter_of(x, dy, filter_shape, p));   /* as backward_input's */
}

static mg_tensor *backward_filter_of (mg_tensor *x, mg_tensor *dy, const int64_t filter_shape[4],
                                      const mg_conv_params *p) {
  const char *fn = "conv2d_backward_filter";
  char s1[160], s2[200];
  if (check_image(fn, "input", "(N,H,W,C)", x) != MG_OK) return NULL;
  if (check_image(fn, "dy", "(N,OH,OW,Cout)", dy) != MG_OK) return NULL;
  if (check_same_dtype(fn, "input", x, "dy", dy) != MG_OK) return NULL;
  if (check_shape4(fn, "filter_shape", filter_shape) != MG_OK) return NULL;
  if (filter_shape[2] != x->shape[3])
    return mg_seterror("%s: input has %lld channels, filter_shape expects %lld", fn, (long long)x->shape[3],
                       (long long)filter_shape[2]), NULL;
  geom g;
  if (geom_init(fn, &g, x->shape, filter_shape[0], filter_shape[1], filter_shape[3], p, false) != MG_OK)
    return NULL;
  snprintf(s2, sizeof s2, "the input %s", shape_s(s1, sizeof s1, x->shape, 4));
  if (check_dy(fn, dy, &g, s2) != MG_OK) return NULL;
  FLOAT16_AS_FLOAT32(x, dy, backward_filter_of(x, dy, filter_shape, p));
  return conv2d_bf_g(&g, x, dy);
}

/* }============================================================= */


/* {========================== pooling =========================== */

/* the checks of a pool's input and window; fills g */
static mg_status pool_geom (const char *fn, geom *g, const int64_t *xshape, const int64_t *window,
                            const mg_conv_params *p) {
  if (window == NULL) return mg_seterror("%s: window is NULL", fn);
  if (window[0] < 1 || window[1] < 1)
    return mg_seterror("%s: the window must be at least 1x1, got %lldx%lld", fn, (long long)window[0],
                       (long long)window[1]);
  return geom_init(fn, g, xshape, window[0], window[1], xshape[3], p, true);
}

/* max_pool2d: y = the maximum of each window.
** grad: dx = max_pool2d_backward(x, dout) */
static mg_status max_pool_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  geom g;
  geom_from_attr(&g, n->attr);
  mg_tensor *x = n->in[0], *d = dout[0]->dtype == x->dtype ? mg_tensor_retain(dout[0]) : mg_cast(dout[0], x->dtype);
  din[0] = d ? max_pool_bwd_g(&g, x, d) : NULL;
  mg_tensor_release(d);
  return MG_OK;
}
MG_ROW(MAX_POOL, max_pool) = {
  .forward = conv_family_forward,
  .info = {.name = "max_pool2d", .kind = MG_OP_OTHER, .doc = "the maximum of each window of NHWC images"},
  .saves = MG_SAVE_IN(0), .backward = max_pool_backward,
};

mg_tensor *mg_max_pool2d (mg_tensor *x, const int64_t window[2], const mg_conv_params *p) {
  MG_CHECK_ARG("mg_max_pool2d", x, NULL);
  /* bfloat16 pools as it is (a maximum is exact), float16 in float32 (autocast.c) */
  RETRY_AS(x, x->dtype == MG_FLOAT16, MG_FLOAT32, mg_max_pool2d(x, window, p));
  geom g;
  if (check_image("max_pool2d", "input", "(N,H,W,C)", x) != MG_OK) return NULL;
  if (pool_geom("max_pool2d", &g, x->shape, window, p) != MG_OK) return NULL;
  return pool_g(&max_pool_op, &g, x);
}

/* max_pool2d_backward: dx = dy at each window's maximum in x, linear in dy.
** grad: d(dy) = dout taken at those maxima; dx = 0 (the maxima move in jumps) */
static mg_status max_pool_bwd_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  geom g;
  geom_from_attr(&g, n->attr);
  if (n->needs[0]) din[0] = mg_zeros_meta(&n->in_meta[0]);
  if (n->needs[1]) {
    mg_scope sc = {0};
    int64_t flat[3] = {g.N, g.H * g.W, g.C}, shape[4];
    out_shape(&g, shape);
    mg_tensor *idx = mg_tmp(&sc, pool_argmax(&g, n->in[0]));
    mg_tensor *d = mg_tmp(&sc, mg_reshape(dout[0], flat, 3));
    din[1] = mg_reshape(mg_tmp(&sc, mg_take_along_axis(d, idx, 1)), shape, 4);
    mg_scope_end(&sc);
  }
  return MG_OK;
}
MG_ROW(MAX_POOL_BWD, max_pool_bwd) = {
  .forward = conv_family_forward,
  .info = {.name = "max_pool2d_backward", .kind = MG_OP_OTHER,
           .doc = "max_pool2d's gradient: each dy to its window's maximum in x"},
  .saves = MG_SAVE_IN(0), .backward = max_pool_bwd_backward,
};

mg_tensor *mg_max_pool2d_backward (mg_tensor *x, mg_tensor *dy, const int64_t window[2],
                                   const mg_conv_params *p) {
  const char *fn = "max_pool2d_backward";
  char s1[160], s2[200];
  MG_CHECK_ARG("mg_max_pool2d_backward", x, NULL);
  MG_CHECK_ARG("mg_max_pool2d_backward", dy, NULL);
  geom g;
  if (check_image(fn, "input", "(N,H,W,C)", x) != MG_OK) return NULL;
  if (check_image(fn, "dy", "(N,OH,OW,C)", dy) != MG_OK) return NULL;
  if (check_same_dtype(fn, "input", x, "dy", dy) != MG_OK) return NULL;
  if (pool_geom(fn, &g, x->shape, window, p) != MG_OK) return NULL;
  snprintf(s2, sizeof s2, "the input %s", shape_s(s1, sizeof s1, x->shape, 4));
  if (check_dy(fn, dy, &g, s2) != MG_OK) return NULL;
  return max_pool_bwd_g(&g, x, dy);
}

/* avg_pool2d: y = the mean of each window's pixels (padding not counted).
** grad: dx = avg_pool2d_backward(dout) */
static mg_status avg_pool_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  geom g;
  geom_from_attr(&g, n->attr);
  din[0] = avg_pool_bwd_g(&g, dout[0]);
  return MG_OK;
}
MG_ROW(AVG_POOL, avg_pool) = {
  .forward = conv_family_forward,
  .info = {.name = "avg_pool2d", .kind = MG_OP_OTHER,
           .doc = "the mean of each window of NHWC images (padding not counted)"},
  .backward = avg_pool_backward,
};

mg_tensor *mg_avg_pool2d (mg_tensor *x, const int64_t window[2], const mg_conv_params *p) {
  MG_CHECK_ARG("mg_avg_pool2d", x, NULL);
  HALF_AS_FLOAT32(x, mg_avg_pool2d(x, window, p));
  geom g;
  if (check_image("avg_pool2d", "input", "(N,H,W,C)", x) != MG_OK) return NULL;
  if (pool_geom("avg_pool2d", &g, x->shape, window, p) != MG_OK) return NULL;
  return pool_g(&avg_pool_op, &g, x);
}

/* avg_pool2d_backward: dx = each dy shared among its window, linear; the
** adjoint of avg_pool2d.  grad: d(dy) = avg_pool2d(dout) */
static mg_status avg_pool_bwd_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  geom g;
  geom_from_attr(&g, n->attr);
  din[0] = pool_g(&avg_pool_op, &g, dout[0]);
  return MG_OK;
}
MG_ROW(AVG_POOL_BWD, avg_pool_bwd) = {
  .forward = conv_family_forward,
  .info = {.name = "avg_pool2d_backward", .kind = MG_OP_OTHER,
           .doc = "avg_pool2d's gradient: each dy shared evenly among its window"},
  .backward = avg_pool_bwd_backward,
};

mg_tensor *mg_avg_pool2d_backward (mg_tensor *dy, const int64_t input_shape[4], const int64_t window[2],
                                   const mg_conv_params *p) {
  const char *fn = "avg_pool2d_backward";
  char s1[160], s2[200];
  MG_CHECK_ARG("mg_avg_pool2d_backward", dy, NULL);
  geom g;
  if (check_image(fn, "dy", "(N,OH,OW,C)", dy) != MG_OK) return NULL;
  if (check_shape4(fn, "input_shape", input_shape) != MG_OK) return NULL;
  if (pool_geom(fn, &g, input_shape, window, p) != MG_OK) return NULL;
  snprintf(s2, sizeof s2, "input_shape %s", shape_s(s1, sizeof s1, input_shape, 4));
  if (check_dy(fn, dy, &g, s2) != MG_OK) return NULL;
  return avg_pool_bwd_g(&g, dy);
}

/* }============================================================= */


MG_FAMILY(mg_conv_ops, CONV_OPS, CONV__COUNT);
