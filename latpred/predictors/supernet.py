"""Score a supernet's subnets from per-block caches: `predict_many`'s result, far faster.

A subnet is a sequence of blocks (stem, blocks, head), its graph their graphs chained end to
end (`latpred.pytorch.compose.chain`). On a CPU target each op is one kernel with its own op's
features, so a subnet's kernels are its blocks' kernels and its prediction can be assembled
from what is cached per block:

- its kernel count and the bytes its kernels read and write;
- the summed predictions of its kernels whose regressor does not read `context_bytes`;
- the configurations (feature rows) of those whose regressor does (conv and FC kernels);
- with an end-to-end residual stage (predictors/residual.py), the same per kernel type.

Per batch of subnets, each subnet's `context_bytes` is that of its blocks' summed bytes (as
`predict_many` sums them over the chained graph's kernels); the context kernels are predicted
with one regressor call per group for the whole batch, each distinct (configuration, context)
once; the overhead model (and the residual stage) is applied to the summed counts and
latencies.

    scores = BlockScores(model, {key: block_graph, ...})
    scores.verify(some_subnets)            # == predict_many on their chained graphs, or raises
    total_ms = scores.predict([[stem, b1, b2, ..., head], ...])   # keys of the blocks

This is exact when no kernel spans two blocks and a block's kernels have the same features
alone as in the chain: on a CPU target, blocks that `chain` joins cleanly (a block ending in a
zero PAD that the next block's convolution would fold is the exception `verify` catches).
GPU targets fuse and partition across blocks and are refused: chain their subnets and call
`predict_many`.
"""

from __future__ import annotations

from itertools import chain as flatten
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from latpred.errors import PredictorError
from latpred.features import context_bytes
from latpred.graph import Graph
from latpred.predictors.residual import by_type


class BlockScores:
    """Per-block caches of a LatencyModel's predictions (module docstring); `blocks` maps a
    key of the caller's choosing to each block's graph (one input, one output). With
    `allow_fallback`, `fallback_types` lists the kernel types the flagged fallback predicts."""

    def __init__(self, model: Any, blocks: Mapping[Hashable, Graph], *,
                 allow_fallback: bool = False) -> None:
        from latpred.deduce import deduce
        from latpred.predictors.batch import predict_configs

        target = model._target()
        if target.processor != "cpu":
            raise PredictorError(f"Block scores need a CPU target (one op, one kernel); "
                                 f"{model.target} fuses across blocks: use predict_many on "
                                 "chained graphs.")
        self.model, self.allow_fallback = model, allow_fallback
        self.index = {key: i for i, key in enumerate(blocks)}
        self.graphs = list(blocks.values())
        kernels = [tuple(deduce(g, target)) for g in self.graphs]
        batch, missing = model.feature_batch(self.graphs, kernels, allow_fallback=allow_fallback)
        self.fallback_types = tuple(sorted(missing))
        sizes = np.array([len(ks) for ks in kernels], dtype=np.intp)
        block_of = np.repeat(np.arange(len(sizes)), sizes)
        n = len(sizes)
        self.n_kernels = sizes.astype(np.float64)
        # A typed overhead (predictors/overhead.py) reads each subnet's kernels per type.
        self.type_counts = model.overhead_type_counts(kernels) or {}
        self.moved = np.bincount(block_of, batch.moved[batch.config], minlength=n)
        self._context_rows(batch)
        plain = ~self._needs_context[batch.config]
        plain_ms = predict_configs(batch, model.regressors())[batch.config[plain]]
        self.plain_ms = np.bincount(block_of[plain], plain_ms, minlength=n)
        self._context_kernels(block_of[~plain], batch.config[~plain], n)
        self._residual_caches(kernels, batch, block_of, plain, plain_ms)

    def _residual_caches(self, kernels, batch: Any, block_of: np.ndarray, plain: np.ndarray,
                         plain_ms: np.ndarray) -> None:
        """Per block and kernel type of the residual stage: its kernels and the plain ones'
        summed latency (`plain_ms`: the plain kernels' predictions); per configuration, its
        type's column (-1: not one of the stage's)."""
        stage = self.model.residual
        if stage is None:
            return
        index = {t: i for i, t in enumerate(stage.types)}
        col = np.fromiter((index.get(k.type, -1) for ks in kernels for k in ks), dtype=np.intp,
                          count=len(block_of))
        ms = np.zeros(len(block_of))
        ms[plain] = plain_ms
        self.r_counts, self.r_plain = by_type(block_of, col, ms, len(self.graphs), len(index))
        self._config_col = np.full(batch.n_configs, -1, dtype=np.intp)
        for group, ids in batch.members.items():
            self._config_col[ids] = index.get(group, -1)

    def _context_rows(self, batch: Any) -> None:
        """Per configuration: whether its group reads context_bytes, the group, its row."""
        self._rows, self._col = {}, dict(batch.context_col)
        self._needs_context = np.zeros(batch.n_configs, dtype=bool)
        self._group_of = np.full(batch.n_configs, -1, dtype=np.intp)
        self._row_of = np.full(batch.n_configs, -1, dtype=np.intp)
        self._groups = list(self._col)
        for gi, group in enumerate(self._groups):
            ids = batch.members[group]
            self._rows[group] = batch.rows[group]
            self._needs_context[ids] = True
            self._group_of[ids] = gi
            self._row_of[ids] = np.arange(len(ids))

    def _context_kernels(self, block: np.ndarray, config: np.ndarray, n_blocks: int) -> None:
        """Per block, its context kernels' distinct configurations and counts (as CSR)."""
        pairs, counts = np.unique(np.column_stack([block, config]), axis=0, return_counts=True)
        pairs = pairs.reshape(-1, 2)
        self._ptr = np.searchsorted(pairs[:, 0], np.arange(n_blocks + 1))
        self._ctx_config, self._ctx_count = pairs[:, 1], counts.astype(np.float64)

    # -- scoring -------------------------------------------------------------------------------
    def predict(self, subnets: Iterable[Sequence[Hashable]]) -> np.ndarray:
        """Predicted end-to-end latency (ms) of each subnet, given as its blocks' keys in order;
        equal to `predict_many(...)[i].total_ms` of the chained graphs."""
        blocks, lengths = self._block_ids(subnets)
        m = len(lengths)
        owner = np.repeat(np.arange(m), lengths)
        n = np.bincount(owner, self.n_kernels[blocks], minlength=m)
        context = context_bytes(np.bincount(owner, self.moved[blocks], minlength=m))
        # A batch's subnets share few contexts (rounded to 1/8 octave): number them, so that
        # (block, context) and (configuration, context) pairs are single ints to deduplicate.
        contexts, code = np.unique(context, return_inverse=True)
        code = code.reshape(-1)[owner]
        sums = np.bincount(owner, self.plain_ms[blocks], minlength=m)
        sums += np.bincount(owner, self._context_ms(blocks, code, contexts), minlength=m)
        typed = {t: np.bincount(owner, c[blocks], minlength=m)
                 for t, c in self.type_counts.items()}
        total = sums + self.model.overhead.predict(n, sums, typed)
        if self.model.residual is not None:
            total += self._residual(blocks, owner, code, contexts, m)
        return total

    def _residual(self, blocks: np.ndarray, owner: np.ndarray, code: np.ndarray,
                  contexts: np.ndarray, m: int) -> np.ndarray:
        """The residual stage's correction of `m` subnets from their blocks' per-type caches."""
        by_block = self.r_plain[blocks] + self._context_ms(blocks, code, contexts, typed=True)
        per = [np.stack([np.bincount(owner, a[:, j], minlength=m) for j in range(a.shape[1])],
                        axis=1) for a in (self.r_counts[blocks], by_block)]
        return self.model.residual.predict(*per)

    def _block_ids(self, subnets: Iterable[Sequence[Hashable]]) -> tuple[np.ndarray, list[int]]:
        get = self.index.__getitem__
        try:
            ids = [list(map(get, s)) for s in subnets]
        except KeyError as err:
            raise PredictorError(f"No cached block {err.args[0]!r}; pass its graph to "
                                 "BlockScores.") from None
        lengths = list(map(len, ids))
        return np.fromiter(flatten.from_iterable(ids), dtype=np.intp, count=sum(lengths)), lengths

    def _context_ms(self, blocks: np.ndarray, code: np.ndarray, contexts: np.ndarray,
                    typed: bool = False) -> np.ndarray:
        """Per (block, its subnet's context number): the block's context kernels' summed
        latency; `typed`: per kernel type of the residual stage, (blocks, types)."""
        width = self.r_counts.shape[1] if typed else 0
        if not len(self._ctx_config) or not len(blocks):
            return np.zeros((len(blocks), width)) if typed else np.zeros(len(blocks))
        k = len(contexts)
        uniq, back = np.unique(blocks * k + code, return_inverse=True)
        ub, uc = uniq // k, uniq % k
        starts, lengths = self._ptr[ub], self._ptr[ub + 1] - self._ptr[ub]
        pair = np.repeat(np.arange(len(ub)), lengths)
        entry = np.arange(lengths.sum()) + np.repeat(starts - (np.cumsum(lengths) - lengths),
                                                     lengths)
        ms = self._predict_context(self._ctx_config[entry], uc[pair], contexts)
        if typed:
            _, out = by_type(pair, self._config_col[self._ctx_config[entry]],
                             ms * self._ctx_count[entry], len(ub), width)
            return out[back]
        return np.bincount(pair, ms * self._ctx_count[entry], minlength=len(ub))[back]

    def _predict_context(self, config: np.ndarray, code: np.ndarray, contexts: np.ndarray
                         ) -> np.ndarray:
        """Latency of configurations at numbered contexts: one regressor call per group, each
        distinct (configuration, context) once."""
        out = np.empty(len(config))
        regressors = self.model.regressors()
        group, k = self._group_of[config], len(contexts)
        for gi, name in enumerate(self._groups):
            mine = np.flatnonzero(group == gi)
            if not len(mine):
                continue
            uniq, back = np.unique(config[mine] * k + code[mine], return_inverse=True)
            X = self._rows[name][self._row_of[uniq // k]]   # a copy
            X[:, self._col[name]] = contexts[uniq % k]
            out[mine] = regressors[name].predict(X)[back]
        return out

    # -- checking ------------------------------------------------------------------------------
    def verify(self, subnets: Sequence[Sequence[Hashable]], rtol: float = 1e-9) -> None:
        """Raise PredictorError unless `predict(subnets)` equals `predict_many` on the subnets'
        chained graphs (the module docstring says when it cannot)."""
        from latpred.pytorch.compose import chain

        graphs = [chain([self.graphs[self.index[k]] for k in s], rename=False) for s in subnets]
        want = np.array([p.total_ms for p in self.model.predict_many(
            graphs, allow_fallback=self.allow_fallback)])
        got = self.predict(subnets)
        bad = np.flatnonzero(~np.isclose(got, want, rtol=rtol, atol=0.0))
        if len(bad):
            i = bad[0]
            raise PredictorError(f"Block scores differ from predict_many on {len(bad)} of "
                                 f"{len(want)} chained subnets (first: {got[i]:.6g} vs "
                                 f"{want[i]:.6g} ms): a kernel spans two blocks or a block's "
                                 "kernels change when chained; score them with predict_many.")
