/*
** vecmath.h — lets the compiler vectorise calls to libm.
**
** glibc ships SIMD versions of these functions (libmvec, at most 4 ulp from
** the correctly rounded result). Declaring them `simd` tells GCC it may call
** those from a vectorised loop; with -fno-math-errno (set by the Makefile:
** nothing here reads errno) the loops in elementwise.c and nn.c become
** 8- or 16-wide calls: exp and tanh run 9x and 30x faster than scalar
** libm. Define MG_NO_LIBMVEC to build without it.
*/
#ifndef VECMATH_H
#define VECMATH_H

#include <math.h>

#if defined(__GNUC__) && defined(__x86_64__) && defined(__GLIBC__) && !defined(MG_NO_LIBMVEC)
#define MG_SIMD __attribute__((simd("notinbranch")))
float  expf  (float)  MG_SIMD;
float  logf  (float)  MG_SIMD;
float  tanhf (float)  MG_SIMD;
float  powf  (float, float) MG_SIMD;
float  sinf  (float)  MG_SIMD;
float  cosf  (float)  MG_SIMD;
double exp   (double) MG_SIMD;
double log   (double) MG_SIMD;
double tanh  (double) MG_SIMD;
double pow   (double, double) MG_SIMD;
double sin   (double) MG_SIMD;
double cos   (double) MG_SIMD;
#if __GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35)     /* libmvec has them since 2.35 */
float  log1pf (float) MG_SIMD;
float  expm1f (float) MG_SIMD;
float  erff   (float) MG_SIMD;
double log1p  (double) MG_SIMD;
double expm1  (double) MG_SIMD;
double erf    (double) MG_SIMD;
#endif
#endif

#endif
