"""Ensembles (Triton's ensemble_scheduling): a model whose steps run other models of the server, the tensors of one
step feeding the next. graph.py checks the steps at load (pure); scheduler.py runs them for each request."""
