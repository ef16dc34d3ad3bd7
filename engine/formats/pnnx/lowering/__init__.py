"""pnnx ops -> canonical ops. lower.py is the entry (lower_pnnx); context.py holds Ctx, the view of one node
being lowered; registry.py the handler table that the other modules, one per op family, register into."""
