"""Graph rewrites, each a `verb_noun(graph) -> graph` function; `pipeline.PIPELINE` is their one order.

Lowering (lower_pnnx, lower_tnn) maps format ops to canonical ones; infer_shapes, fold_constants,
eliminate_noops, fuse_conv_bn and fuse_epilogue then work on canonical ops only. Modules here are imported
by name (the lowering handlers import `engine.passes.<module>`), so this file imports nothing.
"""
