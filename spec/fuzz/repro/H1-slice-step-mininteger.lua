-- H: slice step math.mininteger: ubsan negation overflow src/lua/ltensor.c:508 (l_slice)
mg.ones{3}:slice({nil, nil, math.mininteger})
