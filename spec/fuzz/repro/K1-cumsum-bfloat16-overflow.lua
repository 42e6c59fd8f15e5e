-- K: the new reductions over the storage-only dtypes (float16/bfloat16) read
-- them as float32/float64: prod (maths.c:497), logsumexp (605), var (689),
-- std (695), norm (841), cumsum (951) all overflow the buffer. cumsum here:
mg.cumsum(mg.cast(mg.ones{4}, "bfloat16"))
