"""Not imported as a package: `xla_backend.launch` puts this folder first on a child's PYTHONPATH
so that Python runs its `sitecustomize` (the join handshake of plain JAX scripts)."""
