"""An interleaved profiling campaign: batches, the drift reference, retests at start and end.

`run_interleaved` is what `runner.profile_models` runs for the interleaved protocol (the default
on the host CPU with XNNPACK):

1. **Start retest.** A seeded sample (`RunOptions.retest_fraction`) of the models still to do is
   timed first and kept in the dataset's `retest.json` (per target: sample, start, end).
2. **Main pass.** The models in batches of `InterleavedProtocol.batch_size`, each batch one call
   of a worker process (`interleaved.measure_batch`); the drift reference joins one batch in
   every `drift_every` models (`drift.py`). A batch whose worker crashes or hangs is re-measured
   model by model, so that only the culprit becomes a failed row. Rows are appended per batch
   (kernels first), so an interrupted campaign resumes where it stopped.
3. **End retest.** The same sample again. The manifest's `noise` gets end-to-end and per-kernel
   test-retest MdAPE and 90th percentile of start against end (the headline figures: they span
   the whole campaign, drift included), and also of the label against either retest.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import pandas as pd

from latpred.errors import LatpredError
from latpred.profile.drift import drift_entry, reference_model
from latpred.profile.estimators import retest_figures
from latpred.profile.interleaved import BatchRequest, ModelRounds
from latpred.profile.interleaved_rows import e2e_and_kernels, extras, kernel_stats, model_stats
from latpred.profile.kernels import kernel_row
from latpred.profile.noise import retest_sample
from latpred.profile.prepare import _prepare

RETEST_FILE = "retest.json"


def _batches(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def measure_preps(preps: list, worker, measurer, timeout_s: float, with_reference: bool
                  ) -> tuple[list[tuple[str, ModelRounds | None, str]], ModelRounds | None]:
    """Time a batch of prepared models (and the reference); per model (status, rounds, error).

    A batch whose worker crashes or hangs is measured again one model at a time.
    """
    todo = [p for p in preps if not p.error]
    data = [p.data for p in todo] + ([reference_model()] if with_reference else [])
    results: dict[int, tuple[str, ModelRounds | None, str]] = {}
    reference: ModelRounds | None = None
    if data:
        request = BatchRequest(models=tuple(data), protocol=measurer.interleaved,
                               threads=measurer.threads, cpus=measurer.cpus,
                               realtime=measurer.realtime, seed=0)
        outcome = worker.call(request, timeout_s=timeout_s * max(1, len(data) // 4))
        if outcome.ok:
            for p, r in zip(todo, outcome.value):
                results[id(p)] = ("ok", r, "") if r.ok else ("failed", None, r.error)
            if with_reference and outcome.value[-1].ok:
                reference = outcome.value[-1]
        elif len(data) > 1:
            for p in todo:
                results[id(p)] = measure_preps([p], worker, measurer, timeout_s, False)[0][0]
            if with_reference:
                reference = measure_preps([], worker, measurer, timeout_s, True)[1]
        elif todo:
            results[id(todo[0])] = (outcome.status, None, outcome.error)
    out = [("failed", None, p.error) if p.error else results[id(p)] for p in preps]
    return out, reference


class Campaign:
    """One interleaved run over `entries` into `ds` (see the module docstring)."""

    def __init__(self, entries, target, ds, worker, measurer, options, report,
                 progress: bool = True) -> None:
        self.entries, self.target, self.ds = list(entries), target, ds
        self.worker, self.measurer, self.options, self.report = worker, measurer, options, report
        self.progress = progress
        self.name = str(target)
        self.estimator = measurer.interleaved.estimator
        self.batch_size = measurer.interleaved.batch_size
        entry = ds.manifest["targets"].get(self.name, {})
        old = entry.get("drift", {})
        self.series: list[dict[str, Any]] = list(old.get("series", []))
        self.done = len(ds.measured_ids(self.name))
        self.ref_every = max(0, options.drift_every)

    # -- the campaign --------------------------------------------------------------------------
    def run(self) -> None:
        done = self.ds.measured_ids(self.name)
        todo = [e for e in self.entries if e.model_id not in done]
        retest = self._retest_state(todo)
        by_id = {e.model_id: e for e in self.entries}
        sample = [by_id[m] for m in retest.get("sample", []) if m in by_id]
        if sample and "start" not in retest:
            retest["start"] = self._retest(sample, "start")
            self._save_retest(retest)
        self._main(todo, _prepare)
        if sample and "end" not in retest:
            retest["end"] = self._retest(sample, "end")
            self._save_retest(retest)
        if sample:
            self.report.noise = self._noise(retest)
        self.report.drift = self._drift_entry()

    def _main(self, todo, prepare) -> None:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc=f"profile {self.name}", unit="model",
                   disable=not self.progress, dynamic_ncols=True)
        since_ref = self.ref_every  # the first batch carries the reference
        for batch in _batches(todo, self.batch_size):
            preps = [prepare(e, self.target, self.options) for e in batch]
            with_ref = self.ref_every > 0 and since_ref >= self.ref_every
            results, ref = measure_preps(preps, self.worker, self.measurer,
                                         self.options.timeout_s, with_ref)
            self._write(preps, results)
            since_ref = len(batch) if with_ref else since_ref + len(batch)
            self.done += len(batch)
            self._record(ref, "main")
            bar.update(len(batch))
            bar.set_postfix(kernels=self.report.kernels_measured,
                            failed=self.report.models_failed)
        bar.close()

    def _write(self, preps, results) -> None:
        krows, mrows = [], []
        for prep, (status, rounds, error) in zip(preps, results):
            mid = prep.row["model_id"]
            if rounds is None:
                stats = {"status": status, "latency_ms": float("nan"),
                         "latency_iqr_ms": float("nan"), "latency_min_ms": float("nan"),
                         "n_runs": 0, **extras(None, self.estimator)}
                mrows.append({**prep.row, **stats, "error": _join(error, prep.note)})
                continue
            note = prep.note
            if prep.plans:
                try:
                    ks = kernel_stats(prep.graph, [p.kernel for p in prep.plans], rounds,
                                      self.estimator)
                except LatpredError as err:  # the model's time stands; its kernels do not
                    note = f"kernels not measured: {err}"
                else:
                    krows += [kernel_row(mid, self.name, plan, s)
                              for plan, s in zip(prep.plans, ks)]
                    self.report.kernels_measured += len(ks)
            mrows.append({**prep.row, **model_stats(rounds, self.estimator), "error": note})
        if krows:  # kernels first: a model with a model row counts as done
            self.ds.append_kernels(pd.DataFrame(krows))
        if mrows:
            self.ds.append_models(pd.DataFrame(mrows))
        self.report.models_measured += len(mrows)
        self.report.models_failed += sum(r["status"] != "ok" for r in mrows)

    # -- drift -----------------------------------------------------------------------------------
    def _record(self, ref: ModelRounds | None, phase: str) -> None:
        if ref is None:
            return
        e2e, _ = e2e_and_kernels(_NoPlans, ref, self.estimator)
        self.series.append({"t": round((ref.started + ref.finished) / 2, 2),
                            "ms": round(e2e, 6), "models_done": self.done, "phase": phase})
        self.ds.update_manifest(self.name, drift=self._drift_entry())

    def _drift_entry(self) -> dict[str, Any]:
        return drift_entry(self.series, self.ref_every, self.options.drift_bound_pct,
                           self.estimator)

    # -- retests ---------------------------------------------------------------------------------
    def _retest_state(self, todo) -> dict[str, Any]:
        every = self.ds.read_json(RETEST_FILE) or {}
        state = every.get(self.name)
        if state is None or ("end" in state and todo):  # a new campaign on this dataset
            ids = [e.model_id for e in todo]
            state = {"seed": self.options.seed, "fraction": self.options.retest_fraction,
                     "sample": retest_sample(ids, self.options.retest_fraction,
                                             self.options.seed)}
            self._save_retest(state)
        return state

    def _save_retest(self, state: dict[str, Any]) -> None:
        every = self.ds.read_json(RETEST_FILE) or {}
        every[self.name] = state
        self.ds.write_json(RETEST_FILE, every)

    def _retest(self, sample, phase: str) -> dict[str, Any]:
        out: dict[str, Any] = {"t": time.time()}
        for i, batch in enumerate(_batches(sample, self.batch_size)):
            preps = [_prepare(e, self.target, self.options) for e in batch]
            results, ref = measure_preps(preps, self.worker, self.measurer,
                                         self.options.timeout_s, self.ref_every > 0 and i == 0)
            self._record(ref, phase)
            for prep, (status, rounds, _) in zip(preps, results):
                if rounds is not None:
                    e2e, kern = e2e_and_kernels(prep, rounds, self.estimator)
                    out[prep.row["model_id"]] = {"e2e_ms": e2e, "kernels_ms": kern}
        return out

    def _noise(self, retest: dict[str, Any]) -> dict[str, Any]:
        models = self.ds.models(self.name)
        kernels = self.ds.kernels(self.name).sort_values(["model_id", "kernel_index"])
        label = models[models["status"] == "ok"].set_index("model_id")["latency_ms"].to_dict()
        klabel = kernels[kernels["status"] == "ok"].groupby("model_id")["latency_ms"] \
            .apply(list).to_dict() if not kernels.empty else {}
        start, end = retest.get("start", {}), retest.get("end", {})
        sources = {"start": start, "end": end,
                   "label": {m: {"e2e_ms": v, "kernels_ms": klabel.get(m, [])}
                             for m, v in label.items()}}
        pairs = {}
        for a, b in (("start", "end"), ("label", "start"), ("label", "end")):
            e2e, kern = _pairs(sources[a], sources[b])
            pairs[f"{a}_vs_{b}"] = {"e2e": retest_figures(e2e), "kernel": retest_figures(kern)}
        head = pairs["start_vs_end"]
        noise = {"e2e_retest_mdape": head["e2e"]["mdape"], "e2e_retest_p90": head["e2e"]["p90"],
                 "kernel_retest_mdape": head["kernel"]["mdape"],
                 "kernel_retest_p90": head["kernel"]["p90"], "n_retest": head["e2e"]["n"],
                 "retest": "start_vs_end", "pairs": pairs,
                 "hours_apart": round((end.get("t", 0) - start.get("t", 0)) / 3600.0, 3)}
        self.ds.update_manifest(self.name, noise=noise)
        return {k: noise[k] for k in ("e2e_retest_mdape", "e2e_retest_p90",
                                      "kernel_retest_mdape", "kernel_retest_p90", "n_retest")}


class _NoPlans:
    plans = ()


def _pairs(a: dict[str, Any], b: dict[str, Any]) -> tuple[list, list]:
    e2e, kern = [], []
    for mid, first in a.items():
        second = b.get(mid)
        if mid == "t" or not isinstance(first, dict) or not isinstance(second, dict):
            continue
        e2e.append((first["e2e_ms"], second["e2e_ms"]))
        if len(first["kernels_ms"]) == len(second["kernels_ms"]):
            kern += list(zip(first["kernels_ms"], second["kernels_ms"]))
    return e2e, kern


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def run_interleaved(entries, target, ds, worker, measurer, options, report,
                    progress: bool = True) -> None:
    """Measure `entries` (resuming) with the interleaved protocol; fills `report`."""
    Campaign(entries, target, ds, worker, measurer, options, report, progress).run()
