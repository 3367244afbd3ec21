"""Power and energy: APGPM counter-based power models (`apgpm`, its least squares in `fitting`,
the paper's baselines in `baselines`) and energy per inference for a NAS loop (`energy`).
See docs/energy.md."""

from latpred.power.apgpm import (APGPM, APGPMSelect, candidates, cluster, correlations,
                                 interdependence)
from latpred.power.baselines import AllCountersModel, TopKModel, UtilFreqModel
from latpred.power.fitting import LinearFit, mape

__all__ = ["APGPM", "APGPMSelect", "AllCountersModel", "LinearFit", "TopKModel",
           "UtilFreqModel", "candidates", "cluster", "correlations", "interdependence", "mape"]
