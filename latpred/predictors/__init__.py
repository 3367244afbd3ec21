"""Latency predictors: per-kernel-type regressors (Lasso, RF, GBDT, MLP), overhead, LatencyModel.

    from latpred.predictors import LatencyModel
    model = LatencyModel.fit("datasets/synthetic", "host/cpu/fp32/t1", family="gbdt")
    model.save("pred/")                      # predictor.json + one safe artifact per kernel type
    LatencyModel.load("pred/").predict("model.tflite").total_ms
"""

from latpred.predictors.forest import PercentRandomForest
from latpred.predictors.gbdt import PercentGBDT
from latpred.predictors.lasso import PositiveLasso
from latpred.predictors.mlp import PercentMLP
from latpred.predictors.model import LatencyModel, Prediction
from latpred.predictors.overhead import OverheadModel, fit_overhead
from latpred.predictors.search import FAMILIES, SearchSpec, fit_searched, load_search
from latpred.predictors.supernet import BlockScores

__all__ = ["LatencyModel", "Prediction", "PositiveLasso", "PercentRandomForest", "PercentGBDT",
           "PercentMLP", "OverheadModel", "fit_overhead", "FAMILIES", "SearchSpec",
           "fit_searched", "load_search", "BlockScores"]
