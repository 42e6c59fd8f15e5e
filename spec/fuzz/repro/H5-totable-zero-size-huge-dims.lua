-- H: ubsan src/lua/lauxmg.c:372 (push_level: strides[d] * element size)
mg.ones({0, 1 << 62}):totable()
