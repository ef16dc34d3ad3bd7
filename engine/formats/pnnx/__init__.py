"""The pnnx format: `x.pnnx.param` (graph text) + `x.pnnx.bin` (stored zip of weights).

reader.py builds the Graph (param_values.py parses the item values, zip_archive.py maps the weights archive);
writer.py writes a model from param text and arrays (tests and tools); lowering/ maps pnnx ops to canonical ops.
"""
