"""Canonical graph -> TNN files (the inverse of lowering/). write.py is the entry (write_tnn); core.py holds the
Writer (names, shapes, emitted layers, the bytes of both files); registry.py the rule table that the other modules,
one per op family, register into; int8.py writes TNN's quantized layers back."""
