"""Compile a graph for a device at max shapes (plan, arena, kernels) and run it: Model and Instance."""
