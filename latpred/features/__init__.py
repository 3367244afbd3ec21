"""Features per operation and per dispatched kernel (see `operation` and `kernel` for the exact
definitions), the fixed column order per kernel type, and feature matrices for the regressors."""

from latpred.features.kernel import (CONTEXT, FEATURES, context_bytes, feature_matrix,
                                     kernel_features)
from latpred.features.operation import op_features

__all__ = ["CONTEXT", "FEATURES", "context_bytes", "feature_matrix", "kernel_features", "op_features"]
