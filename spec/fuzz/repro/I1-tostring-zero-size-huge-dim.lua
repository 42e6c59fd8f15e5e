-- I: hang: tostring of a 0-element tensor with a huge dimension walks all 2^40
-- (empty) rows: format.c cuts only when numel > SUMMARY_OVER, and numel is 0.
-- x:totable() hangs the same way (2^40 empty tables).
print(tostring(mg.eye(1 << 40, 0)))
