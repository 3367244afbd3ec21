"""Reading a torch.profiler trace of CUDA runs (`cuda.profile_group`): which model, run and op
launched each kernel (`attribute`), and each kernel's in-context time (`kernel_figures`).

Pure Python over the Chrome trace's events: no torch, so it is tested here without a GPU.
"""

from __future__ import annotations

import bisect
import re
import statistics


def gpu_kernels(evs: list[dict]) -> list[dict]:
    kernels = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(kernels, key=lambda e: e["ts"])


def named_ranges(evs: list[dict], pattern) -> list[tuple[float, float, tuple]]:
    """Sorted (start, end, groups) of the user ranges whose name matches `pattern`."""
    out = []
    for e in evs:
        if e.get("cat") == "user_annotation":
            m = pattern.match(e["name"])
            if m:
                out.append((e["ts"], e["ts"] + e["dur"], m.groups()))
    return sorted(out)


def find_range(ranges: list[tuple[float, float, tuple]], starts: list[float], ts: float):
    """The groups of the latest-starting range of `ranges` if it holds `ts`, else None (ranges
    of one kind do not nest)."""
    j = bisect.bisect_right(starts, ts) - 1
    if j >= 0 and ts <= ranges[j][1]:
        return ranges[j][2]
    return None


RUN_RANGE = re.compile(r"latpred_model(\d+)_run(\d+)$")
REPLAY_RANGE = re.compile(r"latpred_model(\d+)_replay$")


def attribute(trace: dict, n_models: int, n_runs: int) -> tuple[list, list]:
    """Kernels of a profiled group of models, from the Chrome trace of `cuda._trace`.

    Returns (eager, replay): `eager[k][r]` lists model k's kernels of eager run r in order as
    (op index, kernel name, duration us, start us); `replay[k]` lists (name, duration us,
    start us) of the kernels its graph replays ran. A kernel belongs to the range, on the CPU,
    around the runtime call that launched it (matched by correlation id): the innermost `latpred_op<i>` range gives its
    op (-1 outside every op).
    """
    from latpred.pytorch import RANGE_PREFIX

    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    ops = named_ranges(evs, re.compile(rf"{RANGE_PREFIX}(\d+):"))
    runs, replays = named_ranges(evs, RUN_RANGE), named_ranges(evs, REPLAY_RANGE)
    op_starts, run_starts = [r[0] for r in ops], [r[0] for r in runs]
    replay_starts = [r[0] for r in replays]
    launch = {e["args"].get("correlation"): e["ts"] for e in evs
              if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in e.get("args", {})}
    eager = [[[] for _ in range(n_runs)] for _ in range(n_models)]
    replay: list[list] = [[] for _ in range(n_models)]
    for k in gpu_kernels(evs):
        ts = launch.get(k.get("args", {}).get("correlation"))
        if ts is None:
            continue
        g = find_range(runs, run_starts, ts)
        if g is not None:
            op = find_range(ops, op_starts, ts)
            eager[int(g[0])][int(g[1])].append((int(op[0]) if op else -1, k["name"],
                                                float(k["dur"]), float(k["ts"])))
            continue
        g = find_range(replays, replay_starts, ts)
        if g is not None:
            replay[int(g[0])].append((k["name"], float(k["dur"]), float(k["ts"])))
    return eager, replay


def exclusive_us(spans: list[tuple[float, float]]) -> list[float]:
    """Each kernel's share of the GPU's busy time, from (duration us, start us) pairs in any
    order: every instant is split equally among the kernels running then, so the shares add
    up to the time at least one kernel ran.

    Kernels overlap when a library forks work onto its own streams: cuDNN runs a grouped
    convolution's per-group kernels side by side (on the H100 a synthetic model's replayed
    kernels added up to 0.33 ms in a 0.23 ms replay); summing their durations would count the
    op's time several times. Kernels that run alone keep their duration."""
    edges = sorted({t for d, s in spans for t in (s, s + d)})
    order = sorted(range(len(spans)), key=lambda i: spans[i][1])
    shares = [0.0] * len(spans)
    active: list[int] = []
    nxt = 0
    for lo, hi in zip(edges, edges[1:]):
        while nxt < len(order) and spans[order[nxt]][1] <= lo:
            active.append(order[nxt])
            nxt += 1
        active = [i for i in active if spans[i][1] + spans[i][0] > lo]
        for i in active:
            shares[i] += (hi - lo) / len(active)
    return shares


def _times(spans: list[tuple]) -> list[float]:
    """Per-kernel times of one run from (duration,) or (duration, start) tuples."""
    if spans and len(spans[0]) == 2:
        return exclusive_us(spans)
    return [t[0] for t in spans]


# The same memset node as the eager runs' "Memset (Device)" is named "memset32" (or 8/16)
# when a CUDA graph replays it (seen on the H100, torch 2.11 / CUDA 13.0).
_MEMSET = re.compile(r"memset(8|16|32)$")


def _kernel_name(name: str) -> str:
    return "Memset (Device)" if _MEMSET.match(name) else name


def match_replay(ref: list[str], replayed: list[str]) -> list[int] | None:
    """For each kernel of one replay, the index of the eager kernel it is, or None when the
    two lists are not the same kernels.

    A replay runs the captured forward's kernels, but the profiler lists them by start time,
    and a graph may start independent kernels in another order than the eager stream did:
    cuDNN's grouped convolutions (the slice, pad and per-group GEMM kernels of one op) were
    seen reordered in 250 of 416 RegNet models. Each replayed kernel is matched to the
    earliest eager kernel of the same name not yet matched: kernels of earlier ops are all
    matched before a reordered op's, so a kernel finds its own op's twin."""
    if len(ref) != len(replayed):
        return None
    waiting: dict[str, list[int]] = {}
    for i in reversed(range(len(ref))):
        waiting.setdefault(_kernel_name(ref[i]), []).append(i)
    order = []
    for name in replayed:
        stack = waiting.get(_kernel_name(name))
        if not stack:
            return None
        order.append(stack.pop())
    return order


def kernel_figures(runs: list, replayed: list, n_replays: int) -> dict:
    """Per kernel of one model: op, name and in-context time (see the module docstring).

    `runs`: eager runs as lists of (op, name, duration us[, start us]); `replayed`: the
    replays' kernels one after the other as (name, duration us[, start us]). A kernel's time
    is its exclusive share (`exclusive_us`) when starts are known, its median over the runs
    used. `kernel_source` says which: "replay" (the replayed list is the eager one, in order),
    "replay-matched" (the same kernels in another order, matched by name: `match_replay`) or
    "eager" (the lists differ: the eager runs' times). `overlap_ms`: how much the used runs'
    kernel durations exceed their busy time (median), i.e. time spent side by side."""
    ref = runs[-1]
    n = len(ref)
    result = {"kernel_source": "eager", "eager_counts": [len(r) for r in runs],
              "replay_kernel_count": len(replayed) // max(1, n_replays), "kernels": []}
    chosen = [[k[2:] for k in run] for run in runs if len(run) == n]
    orders = None
    names = [k[1] for k in ref]
    if n and len(replayed) == n * n_replays:
        orders = [match_replay(names, [k[0] for k in replayed[r * n:(r + 1) * n]])
                  for r in range(n_replays)]
        if all(o is not None for o in orders):
            chosen = []
            for r, order in enumerate(orders):
                spans: list = [None] * n
                for j, i in enumerate(order):
                    spans[i] = replayed[r * n + j][1:]
                chosen.append(spans)
            same = all(o == list(range(n)) for o in orders)
            result["kernel_source"] = "replay" if same else "replay-matched"
    use = [_times(spans) for spans in chosen]
    for j, (op, name, *_) in enumerate(ref):
        result["kernels"].append([op, name, statistics.median(d[j] for d in use)])
    result["gpu_time_ms"] = sum(k[2] for k in result["kernels"]) / 1000.0
    result["overlap_ms"] = statistics.median(
        sum(s[0] for s in spans) - sum(t) for spans, t in zip(chosen, use)) / 1000.0
    return result
