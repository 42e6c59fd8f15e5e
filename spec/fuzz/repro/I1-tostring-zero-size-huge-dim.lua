-- I: hang: tostring (and totable) walk 2^40 empty rows of a 0-element tensor
-- (format.c:81/116, lauxmg.c push_level); nothing elides big tensors either.
print(tostring(mg.eye(1 << 40, 0)))
