"""Triton's Python backend: a model directory with `backend: "python"` and a model.py defining TritonPythonModel.

Each instance of such a model runs in a worker process of its own (stub.py, which imports numpy and the standard
library only, then the user's model.py), so that the model cannot crash or block the server. The server side
(model.py, worker.py) talks to it over a Unix socket in length-checked frames (ipc.py); pb_utils.py is the
`triton_python_backend_utils` module the user's code imports.

This package's __init__ imports nothing: the worker process imports its modules and must stay light.
"""
