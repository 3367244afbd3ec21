"""latpred Graphs as PyTorch modules (the `pytorch-cuda` runtime's model form).

`to_torch(graph, batch=None)` -> `GraphModule`; `with_batch(graph, n)` re-batches a graph;
`op_of_range(name)` maps a profiler range back to its graph op. See `module.py` and `ops.py`.
"""

from latpred.pytorch.batch import graph_batch, with_batch
from latpred.pytorch.module import (RANGE_PREFIX, GraphModule, UnsupportedOpError, op_of_range,
                                    to_torch)

__all__ = ["to_torch", "GraphModule", "with_batch", "graph_batch", "op_of_range",
           "RANGE_PREFIX", "UnsupportedOpError"]
