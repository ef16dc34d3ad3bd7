"""TNN layers -> canonical ops. lower.py is the entry (lower_tnn); state.py holds what the lowering tracks across
layers (shapes, int8 blobs); context.py the per-layer Ctx; registry.py the handler tables that the other modules,
one per layer family, register into."""
