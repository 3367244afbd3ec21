"""Runtimes that measure latency, and imports of measurements made elsewhere.

- `runner.profile_models`: the host-CPU profile loop (end to end and per kernel, resumable,
  noise floor) behind `latpred profile`; by default the interleaved protocol (`interleaved`:
  batches timed round-robin, `estimators`: low-quantile estimators and the stopping rule,
  `campaign`: batches, retests at start and end, `drift`: the reference model, drift
  correction, `interleaved_rows`: dataset rows with per-round statistics); `litert_cpu` times one model with LiteRT, `worker`
  isolates each measurement in a process with a timeout, `prepare` reads a model and plans its
  kernels, `submodel`/`kernels` cut a kernel out of its model, `protocol` holds the timing
  protocol and its statistics.
- `litert_gpu`: LiteRT's GPU accelerator.
- `benchmark_import.import_benchmark`: TFLite benchmark_model op profiles from phones
  (`latpred import-benchmark`), parsed by `benchmark_parse`.
"""
