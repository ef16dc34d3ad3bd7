"""The CPU's blocked activation layout nChw{B}c: its ops, their kernels, and the rewrite that keeps activations
blocked between convolutions."""
