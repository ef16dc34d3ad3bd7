"""Model formats, one folder each (pnnx/, tnn/): a reader, a lowering to canonical ops and, where one exists, a
writer. registry.py's FORMATS names every format with its files; the runtime, the CLI and the server look formats
up there."""
