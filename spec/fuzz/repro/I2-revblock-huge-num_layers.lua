-- I: hang (pure Lua): RevBlock builds a list of num_layers entries with no
-- upper bound (nn.lua callables); 2^40 spins until memory runs out.
mg.nn.RevBlock(function(x) return x end, function(x) return x end, {num_layers = 1 << 40})
