"""The TNN format: `x.tnnproto` (graph text) + `x.tnnmodel` (binary weights), both format versions.

reader.py builds the Graph from tnnproto.py's and tnnmodel.py's readings (constants.py: magics, DataType codes,
layer types); lowering/ maps TNN layers to canonical ops; writer/ writes a canonical graph back as TNN files
(serializer.py encodes the .tnnmodel bytes).
"""
