"""Device-neutral graph rewrites on canonical ops, each a `verb_noun(graph) -> graph` function; `pipeline.PIPELINE`
is their one order (infer_shapes, fold_constants, merge_extent_ops, eliminate_noops, merge_transposes,
fuse_attention, fuse_conv_bn, fuse_conv_scale, fuse_epilogue). Format ops are lowered before, by each format's lowering
(engine/formats/<format>/lowering). Modules here are imported by name (`engine.passes.<module>`), so this file
imports nothing.
"""
