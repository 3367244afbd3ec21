"""LatencyModel: one regressor per kernel type plus the overhead, for one target.

    total = overhead(n_kernels, sum) + sum over kernels k of f_type(k)(features(k))
            [+ residual(counts and predicted sums per kernel type)]

The residual stage (predictors/residual.py) is trained where it cross-validates better.

`predict` takes a Graph or a .tflite path; `predict_many` deduces and featurizes every graph,
then makes one regressor call per kernel type over the kernels of all graphs, which is what
makes scoring thousands of candidates a second possible.

A kernel type without a trained regressor raises PredictorError naming the types. With
`allow_fallback=True` such kernels are predicted by the fallback regressor (a non-negative Lasso
on FLOPs and bytes moved, trained on every measured kernel) and the prediction lists them in
`fallback_types`; never is a kernel silently counted as zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from latpred.errors import DelegateRefusedError, PredictorError
from latpred.gc_pause import paused_gc
from latpred.graph import Graph
from latpred.predictors.overhead import OverheadModel, fit_overhead
from latpred.predictors.residual import fit_residual, per_type, skipped
from latpred.predictors.search import SearchSpec, family_class, load_search
from latpred.predictors.training import (TypeFit, fit_all_types, fit_fallback, load_tables,
                                         out_of_fold_kernels, type_counts, with_graph_columns)


@dataclass(frozen=True, eq=False)
class Prediction:
    """A predicted end-to-end latency (milliseconds) and its per-kernel breakdown.

    `kernels` are the deduced kernels in execution order and `kernel_ms` their predicted
    latencies (same order); `fallback_types` lists kernel types predicted by the fallback;
    `peak_bytes` the model's predicted peak memory on the target, when asked for
    (`LatencyModel.predict_many(..., memory=True)`).
    """

    total_ms: float
    overhead_ms: float
    kernels: tuple[Any, ...]
    kernel_ms: np.ndarray
    fallback_types: tuple[str, ...] = ()
    name: str = ""
    peak_bytes: int | None = None

    @property
    def kernel_sum_ms(self) -> float:
        return float(self.kernel_ms.sum())

    def breakdown(self, graph: Graph | None = None) -> list[dict[str, Any]]:
        """One dict per kernel: index, type, part, ops (types when `graph` is given), ms."""
        rows = []
        for i, (k, ms) in enumerate(zip(self.kernels, self.kernel_ms)):
            ops = [graph.ops[o].type for o in k.ops] if graph is not None else list(k.ops)
            rows.append({"index": i, "type": k.type, "part": k.part, "ops": ops,
                         "latency_ms": float(ms), "fallback": k.type in self.fallback_types})
        return rows


@dataclass(frozen=True)
class LatencyModel:
    """Trained per-kernel-type regressors and overhead for one target."""

    target: str
    family: str
    types: Mapping[str, TypeFit]
    overhead: OverheadModel
    fallback: TypeFit | None = None
    training: Mapping[str, Any] = field(default_factory=dict)
    analytical_features: bool = False  # conv-like types also see the analytical columns
    residual: Any = None   # predictors.residual.ResidualStage, or None

    # -- training ------------------------------------------------------------------------------
    @classmethod
    def fit(cls, dataset: Any, target: str, family: str = "gbdt",
            search: str | SearchSpec = "latpred",
            overhead: str = "auto", model_ids: Iterable[str] | None = None, seed: int = 0,
            progress: Callable[[str, int, int], None] | None = None,
            analytical_features: bool = False, residual: str = "auto") -> "LatencyModel":
        """Train on the measurements of `target` in `dataset` (a Dataset or its directory).

        `search` names a search in configs/predictors/<family>.yaml ("paper", "latpred") or
        "none", or is a SearchSpec; `model_ids` restricts training to those models (a train
        split); `analytical_features` adds the tile/wave and TMModel columns to the conv-like
        kernel types' regressors (predictors/analytical.py; off by default, see
        docs/analytical-features.md); `residual` "auto" trains the end-to-end residual stage
        where it cross-validates better (predictors/residual.py), "off" never.
        """
        kernels, models = load_tables(dataset, target, model_ids, analytical_features)
        from pathlib import Path

        info = {"dataset": str(Path(getattr(dataset, "root", dataset)).resolve())}
        return cls.fit_tables(kernels, models, target, family, search, overhead, seed,
                              progress, info, analytical_features, residual)

    @classmethod
    def fit_tables(cls, kernels, models, target: str, family: str = "gbdt",
                   search: str | SearchSpec = "latpred", overhead: str = "auto", seed: int = 0,
                   progress: Callable[[str, int, int], None] | None = None,
                   info: Mapping[str, Any] | None = None,
                   analytical_features: bool = False, residual: str = "auto"
                   ) -> "LatencyModel":
        """Train on a kernel-rows and a model-rows table (see predictors/training.py); with
        `analytical_features` the kernel rows must carry the analytical columns."""
        family_class(family)
        if kernels.empty:
            raise PredictorError(f"No measured kernel of target {target} to train on.")
        kernels = with_graph_columns(kernels)   # tables built outside load_tables (ablations)
        spec = search if isinstance(search, SearchSpec) else load_search(family, search)
        if spec.family != family:
            raise PredictorError(f"The search is for the {spec.family} family, not {family}.")
        schema = None
        if analytical_features:
            from latpred.predictors.analytical import schemas
            from latpred.target import parse_target

            schema, kernels = schemas(kernels, parse_target(target))
        types = fit_all_types(kernels, spec, seed, progress, schema)
        counts = type_counts(kernels, models["model_id"])
        ovh = fit_overhead(models["n_kernels"].to_numpy(), models["kernel_sum_ms"].to_numpy(),
                           models["latency_ms"].to_numpy(), overhead, seed, counts)
        stage, chosen = _fit_residual(kernels, models, types, spec, ovh, counts, residual, seed)
        ids = sorted(set(kernels["model_id"]) | set(models["model_id"]))
        training = {**(info or {}), "n_models": len(ids), "n_kernel_rows": int(len(kernels)),
                    "search": spec.name, "seed": seed, **chosen, "train_models": ids}
        return cls(target, family, types, ovh, fit_fallback(kernels), training,
                   analytical_features, stage)

    # -- prediction ----------------------------------------------------------------------------
    def predict(self, graph_or_path: Graph | str | os.PathLike | Any, *,
                allow_fallback: bool = False, example_inputs: Any = None) -> Prediction:
        """Predict one model: a Graph, a .tflite or .pt2 file, a torch.nn.Module (with
        `example_inputs`, converted by `latpred.from_torch`) or an ExportedProgram."""
        return self.predict_many([graph_or_path], allow_fallback=allow_fallback,
                                 example_inputs=example_inputs)[0]

    def predict_many(self, graphs: Sequence[Graph | str | os.PathLike | Any], *,
                     allow_fallback: bool = False, example_inputs: Any = None,
                     memory: bool = False) -> list[Prediction]:
        """Predict many models with one regressor call per kernel type (modules are converted
        with the same `example_inputs`). `memory`: each prediction also carries the model's
        peak memory on the target (`peak_bytes`, `latpred.memory`'s total), planned in the
        same pass from what the latency prediction built (memory-aware NAS)."""
        if not memory:
            return self.predict_many_batch(graphs, allow_fallback=allow_fallback,
                                           example_inputs=example_inputs)[0]
        from latpred.memory.fast import predict_many_with_memory

        graphs = [_as_graph(g, example_inputs) for g in graphs]
        preds, peaks = predict_many_with_memory(self, graphs, allow_fallback=allow_fallback)
        return [replace(p, peak_bytes=b) for p, b in zip(preds, peaks.tolist())]

    def predict_many_batch(self, graphs: Sequence[Graph | str | os.PathLike | Any], *,
                           allow_fallback: bool = False, example_inputs: Any = None,
                           visit: Callable[[Graph], Any] | None = None
                           ) -> tuple[list[Prediction], list[Graph], list[tuple], Any]:
        """`predict_many`, and what it built on the way: the graphs, their kernels and their
        `predictors.batch.FeatureBatch` (memory-aware NAS reads tensor sizes and kernel
        configurations there, `latpred.memory.fast`). `visit(graph)` is called right after
        each graph's kernels are deduced, while its ops are still in the CPU caches."""
        from latpred.deduce import deduce

        target = self._target()
        with paused_gc():
            graphs = [_as_graph(g, example_inputs) for g in graphs]
            try:
                kernels = [tuple(deduce(g, target)) for g in graphs] if visit is None else \
                    [_visited(tuple(deduce(g, target)), visit, g) for g in graphs]
            except DelegateRefusedError:
                _name_the_refused(graphs, target)
                raise
            batch, missing = self.feature_batch(graphs, kernels, allow_fallback=allow_fallback)
            return self._predict_batch(graphs, kernels, batch, missing), graphs, kernels, batch

    def predict_kernels(self, graphs: Sequence[Graph], kernels: Sequence[Sequence[Any]], *,
                        allow_fallback: bool = False) -> list[Prediction]:
        """Predict graphs whose kernels are already deduced (kernels[i] belongs to graphs[i])."""
        batch, missing = self.feature_batch(graphs, kernels, allow_fallback=allow_fallback)
        return self._predict_batch(graphs, kernels, batch, missing)

    def _predict_batch(self, graphs, kernels, batch, missing: set[str]) -> list[Prediction]:
        from latpred.predictors.batch import predict_batch

        flat = predict_batch(batch, self.regressors())
        offsets = np.cumsum([0] + [len(ks) for ks in kernels])
        return self._assemble(graphs, kernels, flat, offsets, missing)

    def feature_batch(self, graphs: Sequence[Graph], kernels: Sequence[Sequence[Any]], *,
                      allow_fallback: bool = False) -> tuple[Any, set[str]]:
        """The `predictors.batch.FeatureBatch` of deduced kernels, grouped by the regressor
        that predicts them, and the kernel types left to the fallback."""
        from latpred.predictors.analytical import featurizer
        from latpred.predictors.batch import featurize

        missing = sorted({k.type for ks in kernels for k in ks} - set(self.types))
        if missing and not (allow_fallback and self.fallback is not None):
            raise PredictorError(self._missing_message(missing, allow_fallback))

        def group_of(ktype: str) -> tuple[str, tuple[str, ...]]:
            fit = self.types.get(ktype) or self.fallback
            return fit.kernel_type, fit.features

        batch = featurize(graphs, kernels, self._target(), group_of,
                          featurizer(self.analytical_features))
        return batch, set(missing)

    def regressors(self) -> dict[str, Any]:
        """Regressor per group of a FeatureBatch: per kernel type, and the fallback's."""
        fits = dict(self.types)
        if self.fallback is not None:
            fits[self.fallback.kernel_type] = self.fallback
        return {t: f.regressor for t, f in fits.items()}

    def _assemble(self, graphs, kernels, flat, offsets, missing: set[str]) -> list[Prediction]:
        n = np.diff(offsets)
        sums = np.add.reduceat(flat, offsets[:-1]) if len(flat) else np.zeros(len(graphs))
        sums = np.where(n > 0, sums, 0.0)  # reduceat repeats a value for empty slices
        over = self.overhead.predict(n, sums, self.overhead_type_counts(kernels))
        if self.residual is not None:
            counts, typed = per_type([[k.type for k in ks] for ks in kernels], flat,
                                     self.residual.types)
            over = over + self.residual.predict(counts, typed)
        out = []
        for gi, ks in enumerate(kernels):
            fb = tuple(sorted({k.type for k in ks} & missing)) if missing else ()
            out.append(Prediction(float(sums[gi] + over[gi]), float(over[gi]), tuple(ks),
                                  flat[offsets[gi]:offsets[gi + 1]], fb, graphs[gi].name))
        return out

    def overhead_type_counts(self, kernels) -> dict[str, np.ndarray] | None:
        """Per kernel type of a typed overhead, each kernel list's (a graph's, a block's)
        count of kernels of that type; None for an untyped overhead."""
        if not self.overhead.per_type:
            return None
        types = self.overhead.types
        counts, _ = per_type([[k.type for k in ks] for ks in kernels], None, types)
        return dict(zip(types, counts.T))

    def _target(self):
        from latpred.target import parse_target

        return parse_target(self.target)

    def _missing_message(self, missing: list[str], allow_fallback: bool) -> str:
        why = ("and no fallback was trained" if allow_fallback else
               "(pass allow_fallback=True, or --allow-fallback, to use the flagged fallback)")
        return (f"The predictor for {self.target} has no regressor for kernel type(s) "
                f"{', '.join(missing)} {why}; retrain it on data that measures them.")

    # -- persistence ---------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> None:
        from latpred.predictors.persist import save_model

        save_model(self, directory)

    @classmethod
    def load(cls, directory: str | os.PathLike, target: str | None = None) -> "LatencyModel":
        from latpred.predictors.persist import load_model

        return load_model(directory, target)


def _as_graph(g: Graph | str | os.PathLike | Any, example_inputs: Any = None) -> Graph:
    if isinstance(g, Graph):
        return g
    if not isinstance(g, (str, os.PathLike)) or os.fspath(g).endswith(".pt2"):
        from latpred.pytorch.export import as_graph, load_pt2  # torch only when asked for

        return load_pt2(os.fspath(g)) if isinstance(g, (str, os.PathLike)) else \
            as_graph(g, example_inputs)
    from latpred.tflite import read_tflite

    return read_tflite(g)


def _fit_residual(kernels, models, types, spec, overhead, counts, mode: str, seed: int):
    """The end-to-end residual stage on the training models with every kernel measured, from
    their kernels' out-of-fold predictions (predictors/residual.py), and what the choice
    measured; (None, {...}) where it is off or not kept."""
    import pandas as pd

    skip = skipped(mode, len(models))
    if skip:
        return None, skip
    rows = kernels[kernels["model_id"].isin(set(models["model_id"]))].reset_index(drop=True)
    oof = out_of_fold_kernels(rows, types, spec, seed)
    sums = pd.Series(oof).groupby([rows["model_id"], rows["kernel_type"]]).sum().unstack(
        fill_value=0.0).reindex(index=list(models["model_id"]), columns=list(counts.columns),
                                fill_value=0.0)
    total = sums.sum(axis=1).to_numpy()
    n = models["n_kernels"].to_numpy()
    typed = {t: counts[t].to_numpy() for t in counts.columns}
    base = total + overhead.predict(n, total, typed)
    return fit_residual(counts, sums, base, models["latency_ms"].to_numpy(), seed)


def _name_the_refused(graphs: Sequence[Graph], target) -> None:
    """Raise the refusal again with the position and name of the first model refused, so a
    search scoring a batch knows which candidate to drop (only on the error path)."""
    from latpred.deduce import deduce

    for i, g in enumerate(graphs):
        try:
            deduce(g, target)
        except DelegateRefusedError as e:
            if len(graphs) > 1:
                raise DelegateRefusedError(f"Model {i} of the batch ({g.name}): {e}") from e
            raise


def _visited(kernels: tuple, visit: Callable[[Graph], Any], graph: Graph) -> tuple:
    """`kernels`, after `visit(graph)` (`predict_many_batch`'s per-graph hook)."""
    visit(graph)
    return kernels
