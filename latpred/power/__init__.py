"""Power and energy: APGPM counter-based power models (`apgpm`) and energy per inference for a
NAS loop (`energy`). See docs/energy.md."""

from latpred.power.apgpm import (APGPM, AllCountersModel, APGPMSelect, TopKModel,
                                 UtilFreqModel, candidates, cluster, correlations,
                                 interdependence, mape)

__all__ = ["APGPM", "APGPMSelect", "AllCountersModel", "TopKModel", "UtilFreqModel",
           "candidates", "cluster", "correlations", "interdependence", "mape"]
