"""Few-shot adaptation: carry a predictor trained on one device to another from a few models.

A source predictor has learned how latency varies with a kernel's configuration; a new device
mostly changes how fast each kind of kernel runs (another core, two threads, int8 arithmetic).
So the adapted predictor keeps the source's regressors and learns, from 10-30 models measured
on the new device, what differs (HELP and LitePred adapt from as few; nn-Meter retrains):

- `scale`: one factor per kernel type, the percentage-optimal ratio between the new device's
  kernel latencies and the source's predictions (it minimises Eq. 1's squared percentage error
  in closed form), shrunk towards the factor of all kernels together when a type has few rows;
- `residual`: the factor, then a small, heavily regularised GBDT per kernel type on what is
  left (the ratio measured / scaled prediction, from the type's own features), kept for a
  type where folds grouped by model say they beat the factor: the trees are fine-tuned on
  the residuals instead of retrained;
- `stacked`: the linear family (non-negative cost terms, predictors/lasso_terms) refitted on
  the new device's rows of a type, with the scaled source prediction as one more cost column:
  the source's shape where it carries, the type's own FLOPs / bytes / cache terms where the
  new device departs from it (a faster memory system moves element-wise and FC kernels, not
  convolutions); kept for a type where its cross-validated kernel error beats the factor's,
  and never under STACKED_MIN_ROWS rows; then, with RESIDUAL_MIN_ROWS rows, residual trees on
  what the linear refit leaves, kept where they cross-validate better;
- `global`: one factor for every kernel type (the one of all kernels together);
- `auto`: the simplest of these whose end-to-end MAPE in a cross-validation over the few
  models (grouped by model, so no model is in its own test fold) is within 5% of the best;
  then each kernel type mixed with a regressor trained on the new device's rows alone (a
  Lasso, or small GBDT trees where their blend cross-validates better end to end), by the
  weight whose out-of-fold kernel error is best unless the few models disagree about the gain
  (weight 0: the type retrained from scratch), where that mix also has the lower out-of-fold
  end-to-end MAPE (`blend="none"` keeps the adapted types alone; adapt/auto.py, blend.py).

Kernel types the source never measured are trained from the new device's rows alone (the
fallback Lasso on FLOPs and bytes when too few). The overhead (end to end minus the kernel sum)
is the source's, its milliseconds times the common factor (`scaled`); or the source's cost
per kernel times that factor with the intercept and the share of the kernel sum re-fitted on
the few models (`pinned`); or one re-fitted on them (`refit`, constant under 10 models, as in
training). `auto` cross-validates `scaled` and `pinned` and keeps `scaled` unless `pinned` is
better by more than AUTO_TOLERANCE. `refit` is not weighed: the few models cannot pin down a
cost per kernel (their kernel count grows with their latency), and the zoo's 100+ kernel
models multiply what it gets wrong (t1 -> t2: 9.3% against the source's scaled; the third
VM's t2 zoo 10.5% from 30 models; docs/fewshot.md), which folds of the same small models do
not show (`auto.pinned_overhead`).
The result is an ordinary LatencyModel: its adapted types hold an `AdaptedRegressor` that saves
and loads like any family. A source type with the launch-pattern stage (predictors/launch.py)
keeps its classifier: the adapted regressor embeds both artifacts. The modules: `wrappers`
(the persisted regressors), `types` (the per-type methods), `auto` (the cross-validation and
the choices), `blend` (the scratch partners, the per-type weights, the mixed types).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from latpred.errors import PredictorError
from latpred.predictors.adapt.auto import (OVERHEAD_KINDS, OVERHEAD_SIMPLEST_FIRST,
                                          SIMPLEST_FIRST, choose, cross_validate,
                                          fit_adapted_overhead, type_low)
from latpred.predictors.adapt.blend import blend_types, scratch_types
from latpred.predictors.adapt.types import adapt_types
from latpred.predictors.training import fit_fallback

METHODS = ("auto", *SIMPLEST_FIRST)
OVERHEADS = ("auto", *OVERHEAD_KINDS)
# `type`: `auto` mixes each kernel type's adapted prediction with a regressor trained on the
# new rows alone, weighted by cross-validation (blend.BLEND_WEIGHTS, blend.PARTNERS); `none`:
# the adapted types alone.
BLENDS = ("type", "none")


def adapt_dataset(source, dataset, target: str | None = None, method: str = "auto",
                  seed: int = 0, overhead: str = "auto"):
    """`source` (a LatencyModel or its directory) adapted to the models measured in `dataset`
    (a Dataset or its directory) for `target`, by default the dataset's only target."""
    from pathlib import Path

    from latpred.dataset import Dataset
    from latpred.predictors.model import LatencyModel
    from latpred.predictors.training import load_tables

    if not isinstance(source, LatencyModel):
        source = LatencyModel.load(source)
    ds = dataset if isinstance(dataset, Dataset) else Dataset.open(dataset)
    if target is None:
        targets = ds.targets()
        if len(targets) != 1:
            raise PredictorError(f"The dataset at {ds.root} measures {len(targets)} targets "
                                 f"({', '.join(targets) or 'none'}); name one with --target.")
        target = targets[0]
    kernels, models = load_tables(ds, target)
    info = {"dataset": str(Path(ds.root).resolve())}
    return adapt(source, kernels, models, target, method, seed, info, overhead)


def adapt(source, kernels: pd.DataFrame, models: pd.DataFrame, target: str,
          method: str = "auto", seed: int = 0, info: dict[str, Any] | None = None,
          overhead: str = "auto", blend: str = "type"):
    """The LatencyModel `source` adapted to `target` from the few models' tables (kernel rows
    and model rows as `predictors.training` builds them); `overhead` one of OVERHEADS, `blend`
    one of BLENDS (only `auto` blends: it needs the cross-validation)."""
    from latpred.predictors.model import LatencyModel

    for name, value, allowed in (("adaptation method", method, METHODS),
                                 ("overhead", overhead, OVERHEADS), ("blend", blend, BLENDS)):
        if value not in allowed:
            raise PredictorError(f"Unknown {name} {value!r}; choose one of "
                                 f"{', '.join(allowed)}.")
    if kernels.empty or models.empty:
        raise PredictorError(f"No model of target {target} has its end-to-end and kernel "
                             "latencies measured; adaptation needs a few such models.")
    methods = SIMPLEST_FIRST if method == "auto" else (method,)
    overheads = OVERHEAD_SIMPLEST_FIRST if overhead == "auto" else (overhead,)
    blending = method == "auto" and blend == "type"
    oof = None
    if len(methods) > 1 or len(overheads) > 1:
        oof = cross_validate(source, kernels, models, target, methods, overheads, seed,
                             scratch=blending)
    (chosen, over), cv, over_cv = ((methods[0], overheads[0]), {}, {}) if oof is None else \
        choose(oof, methods, overheads)
    types, common = adapt_types(source, kernels, target, chosen, seed)
    fallback = fit_fallback(kernels) or source.fallback
    weights, blend_cv, partner, partner_cv = {}, None, None, {}
    if oof is not None and blending:
        # kept only where the blend's out-of-fold end-to-end MAPE beats the adapted types'
        # alone (on the same folds): the kernel errors that set the weights do not see how a
        # model's kernel errors add up (another CPU, 10 models: 11.6% blended, 7.5% alone)
        partner, candidate, blend_cv, partner_cv = oof.choose_blend(chosen, over)
        if blend_cv < oof.e2e_mape(chosen, over) and any(w < 1.0 for w in candidate.values()):
            weights = candidate
            types = blend_types(types, scratch_types(kernels, seed, partner), weights,
                                type_low(types, fallback, kernels))
        else:
            partner = None
    ids = sorted(set(kernels["model_id"]) | set(models["model_id"]))
    training = {**(info or {}), "adapted_from": source.target, "source_family": source.family,
                "source_training": dict(source.training), "method": chosen,
                "method_cv_mape": cv, "overhead": over, "overhead_cv_mape": over_cv,
                "blend_weights": weights, "blend_cv_mape": blend_cv,
                "blend_partner": partner, "blend_partner_cv_mape": partner_cv,
                "common_factor": common, "n_models": len(ids),
                "n_kernel_rows": int(len(kernels)), "seed": seed, "train_models": ids}
    return LatencyModel(target, source.family, types,
                        fit_adapted_overhead(over, source.overhead, common, models, seed),
                        fallback, training, source.analytical_features)
