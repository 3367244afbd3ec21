"""Measure cuDNN convolutions on an NVIDIA GPU: latency, kernel names and launch grids.

Runs ON the device machine (python3 with PyTorch + CUDA), stdlib + torch only. The cases are
the distinct convolution geometries (H, W, R, S, stride, padding) of ResNet-50 (torchvision,
v1.5) and Inception-v3; for each case, dtype (fp16, fp32) and batch (1, 32) it sweeps the
output channels K at the layer's input channels C, and the input channels at its K, in steps
of 16 (four points per 64-channel step).

cuDNN runs with `torch.backends.cudnn.benchmark = False`: the library's heuristics pick the
kernel. That is the behaviour the tile paper's kernel-selection classifier learns, it is
deterministic (benchmark=True picks by timing, so a 2% timing wobble can flip the kernel from
run to run), and it needs no per-shape autotuning, which would eat most of the device time.
fp32 keeps PyTorch's default `allow_tf32 = True` for cuDNN, what a user gets.

Latency: `--reps` launches queued behind a `torch.cuda._sleep` so that CPU launch overhead is
not timed, each bracketed by CUDA events; the median is kept. When the sleep ran out before
all launches were queued (an event after it has completed), the configuration is re-timed
behind a 4x longer sleep, up to GLITCH_RETRIES times; each row records `sleep_cycles`,
`glitch_retries` and `timing_clean` (False: still ran out after the last retry). Kernel names and grid/block come
from one profiled call per configuration (kineto trace, `args.grid` / `args.block`); kernels
are matched to configurations through the launch's correlation id and the record_function
range around it.

Configurations are shuffled (fixed seed) and measured until `--seconds` run out, so a cut-off
sweep still covers every case evenly. Rows are appended to `<out>/sweep.jsonl` as they come.

    python3 scripts/h100_conv_sweep.py --out $OUT --seconds 300

`--random-geometries N` measures N random draws of a layer geometry instead of the CASES
(`--with-cases` keeps the CASES beside them): spatial size, kernel shape, stride and padding
drawn from what real CNNs use, `--pairs` (C, K) pairs per draw in multiples of 16, each at
both dtypes and batches (`random_configurations`; `--geometry-seed` fixes the draw, `--seed`
only the measuring order). `--only PREVIOUS.jsonl` restricts the plan to the configurations
measured in an earlier run (a retest of what a cut-off sweep covered):

    python3 scripts/h100_conv_sweep.py --out $OUT/a --seconds 380 --random-geometries 400
    python3 scripts/h100_conv_sweep.py --out $OUT/b --seconds 150 --random-geometries 400 \
        --seed 1 --only $OUT/a/sweep.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

# (net, H, W, R, S, stride, pad_h, pad_w, C, K): one row per distinct geometry, with the
# channels of the first layer in the network that has it (the sweep's centre).
CASES = [
    ("resnet50", 224, 224, 7, 7, 2, 3, 3, 3, 64),
    ("resnet50", 56, 56, 1, 1, 1, 0, 0, 64, 64),
    ("resnet50", 56, 56, 3, 3, 1, 1, 1, 64, 64),
    ("resnet50", 56, 56, 3, 3, 2, 1, 1, 128, 128),
    ("resnet50", 56, 56, 1, 1, 2, 0, 0, 256, 512),
    ("resnet50", 28, 28, 1, 1, 1, 0, 0, 128, 512),
    ("resnet50", 28, 28, 3, 3, 1, 1, 1, 128, 128),
    ("resnet50", 28, 28, 3, 3, 2, 1, 1, 256, 256),
    ("resnet50", 28, 28, 1, 1, 2, 0, 0, 512, 1024),
    ("resnet50", 14, 14, 1, 1, 1, 0, 0, 256, 1024),
    ("resnet50", 14, 14, 3, 3, 1, 1, 1, 256, 256),
    ("resnet50", 14, 14, 3, 3, 2, 1, 1, 512, 512),
    ("resnet50", 14, 14, 1, 1, 2, 0, 0, 1024, 2048),
    ("resnet50", 7, 7, 1, 1, 1, 0, 0, 512, 2048),
    ("resnet50", 7, 7, 3, 3, 1, 1, 1, 512, 512),
    ("inception_v3", 299, 299, 3, 3, 2, 0, 0, 3, 32),
    ("inception_v3", 149, 149, 3, 3, 1, 0, 0, 32, 32),
    ("inception_v3", 147, 147, 3, 3, 1, 1, 1, 32, 64),
    ("inception_v3", 73, 73, 1, 1, 1, 0, 0, 64, 80),
    ("inception_v3", 73, 73, 3, 3, 1, 0, 0, 80, 192),
    ("inception_v3", 35, 35, 1, 1, 1, 0, 0, 192, 64),
    ("inception_v3", 35, 35, 5, 5, 1, 2, 2, 48, 64),
    ("inception_v3", 35, 35, 3, 3, 1, 1, 1, 64, 96),
    ("inception_v3", 35, 35, 3, 3, 2, 0, 0, 288, 384),
    ("inception_v3", 17, 17, 1, 1, 1, 0, 0, 768, 192),
    ("inception_v3", 17, 17, 1, 7, 1, 0, 3, 128, 128),
    ("inception_v3", 17, 17, 7, 1, 1, 3, 0, 128, 192),
    ("inception_v3", 17, 17, 3, 3, 2, 0, 0, 192, 320),
    ("inception_v3", 8, 8, 1, 1, 1, 0, 0, 1280, 320),
    ("inception_v3", 8, 8, 1, 3, 1, 0, 1, 384, 384),
    ("inception_v3", 8, 8, 3, 1, 1, 1, 0, 384, 384),
    ("inception_v3", 8, 8, 3, 3, 1, 1, 1, 448, 384),
]
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
BATCHES = (1, 32)
STEP = 16
MAX_CHANNELS = 1024
# Skip configurations above this many FLOPs: a few huge ones would eat the whole budget.
MAX_FLOPS = 4e11
# GPU sleep in front of each timed burst (~1.5 ms on H100), x4 per retry while it ran out.
SLEEP_CYCLES = 3_000_000
GLITCH_RETRIES = 3


def channel_range(centre: int) -> list[int]:
    """Sweep from STEP to about twice the layer's width (at least 256), capped."""
    top = min(MAX_CHANNELS, max(256, 2 * centre))
    return list(range(STEP, top + 1, STEP))


def out_size(size: int, r: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - r) // stride + 1


def configurations() -> list[dict]:
    rows = []
    for case_id, (net, h, w, r, s, st, ph, pw, c0, k0) in enumerate(CASES):
        pairs = {(c0, k) for k in channel_range(k0)} | {(c, k0) for c in channel_range(c0)}
        for dtype in DTYPES:
            for n in BATCHES:
                for c, k in sorted(pairs):
                    p, q = out_size(h, r, st, ph), out_size(w, s, st, pw)
                    flops = 2.0 * n * p * q * k * c * r * s
                    if flops > MAX_FLOPS:
                        continue
                    rows.append(dict(case=case_id, net=net, dtype=dtype, N=n, C=c, H=h, W=w,
                                     K=k, R=r, S=s, stride=st, pad_h=ph, pad_w=pw, P=p, Q=q,
                                     flops=flops))
    return rows


# Random geometries (`--random-geometries`). Spatial size H = W: half the draws from the
# ImageNet pyramid of ResNet / Inception / VGG (224 and 299 inputs), half log-uniform over the
# integers 7..224 (other input sizes: MobileNet / EfficientNet at 192-320, SSD's 19/38/75,
# YOLO's 13/26/52, ...), so that held-out geometries are not all on a handful of sizes.
SIZES = (7, 14, 17, 28, 35, 56, 71, 112, 147, 224)
P_PYRAMID = 0.5
# (R, S): weight. 1x1 and 3x3 dominate real CNNs; 5x5 / 7x7 stems and Inception's factorised
# 1x3 / 3x1 / 1x7 / 7x1.
KERNELS = {(1, 1): 0.35, (3, 3): 0.35, (5, 5): 0.06, (7, 7): 0.04, (1, 3): 0.03, (3, 1): 0.03,
           (1, 7): 0.07, (7, 1): 0.07}
P_STRIDE2 = 0.2     # downsampling layers (square kernels only, as in the CASES' nets)
P_VALID = 0.25      # padding 0 instead of 'same' (R // 2), for kernels larger than 1x1
P_CENTRED = 0.5     # share of channel counts drawn around the size's typical width
RANDOM_CASE0 = 1000  # case ids of random geometries: RANDOM_CASE0 + i (CASES are 0..31)


def _channels(rng: random.Random, size: int) -> int:
    """A channel count, multiple of STEP in [STEP, MAX_CHANNELS], log-uniform over the whole
    range or (P_CENTRED) within 1.5 octaves of the width real CNNs use at this spatial size
    (64 at 56x56, doubling per halving: 16 at 224, 512 at 7)."""
    lo, hi = math.log2(STEP), math.log2(MAX_CHANNELS)
    if rng.random() < P_CENTRED:
        centre = min(hi, max(lo, math.log2(64 * 56 / size)))
        u = centre + rng.uniform(-1.5, 1.5)
    else:
        u = rng.uniform(lo, hi)
    return int(min(MAX_CHANNELS, max(STEP, STEP * round(2 ** u / STEP))))


def random_geometry(rng: random.Random) -> tuple[int, ...]:
    """(H, W, R, S, stride, pad_h, pad_w), H = W."""
    if rng.random() < P_PYRAMID:
        h = rng.choice(SIZES)
    else:
        h = int(round(math.exp(rng.uniform(math.log(6.5), math.log(224.5)))))
    r, s = rng.choices(list(KERNELS), weights=list(KERNELS.values()))[0]
    stride = 2 if r == s and rng.random() < P_STRIDE2 else 1
    valid = max(r, s) > 1 and rng.random() < P_VALID
    return h, h, r, s, stride, 0 if valid else r // 2, 0 if valid else s // 2


def random_configurations(n_draws: int, seed: int = 0, pairs: int = 8) -> list[dict]:
    """`n_draws` random geometries (deterministic in `seed`), each with `pairs` new (C, K)
    pairs at both dtypes and batches; configurations over MAX_FLOPS are left out as in
    `configurations`. A geometry drawn again (common ones are: 1x1 at 56x56) adds its pairs to
    the first draw's, so one case id is one geometry: RANDOM_CASE0 + i, net "random"."""
    rng = random.Random(seed)
    chans: dict[tuple, list[tuple[int, int]]] = {}
    for _ in range(n_draws):
        g = random_geometry(rng)
        have = chans.setdefault(g, [])
        new = 0
        for _ in range(50 * pairs):
            if new == pairs:
                break
            ck = (_channels(rng, g[0]), _channels(rng, g[0]))
            if ck not in have:
                have.append(ck)
                new += 1
    rows = []
    for i, ((h, w, r, s, st, ph, pw), cks) in enumerate(chans.items()):
        p, q = out_size(h, r, st, ph), out_size(w, s, st, pw)
        for dtype in DTYPES:
            for n in BATCHES:
                for c, k in sorted(cks):
                    flops = 2.0 * n * p * q * k * c * r * s
                    if flops > MAX_FLOPS:
                        continue
                    rows.append(dict(case=RANDOM_CASE0 + i, net="random", dtype=dtype, N=n,
                                     C=c, H=h, W=w, K=k, R=r, S=s, stride=st, pad_h=ph,
                                     pad_w=pw, P=p, Q=q, flops=flops))
    return rows


def config_key(row: dict) -> tuple:
    """What identifies a configuration across runs (tile_validation's `_key`)."""
    return row["case"], row["dtype"], row["N"], row["C"], row["K"]


def make_conv(cfg: dict, device: str):
    dtype = DTYPES[cfg["dtype"]]
    x = torch.randn(cfg["N"], cfg["C"], cfg["H"], cfg["W"], device=device, dtype=dtype)
    wt = torch.randn(cfg["K"], cfg["C"], cfg["R"], cfg["S"], device=device, dtype=dtype)
    stride, pad = cfg["stride"], (cfg["pad_h"], cfg["pad_w"])

    def run() -> torch.Tensor:
        return torch.nn.functional.conv2d(x, wt, None, stride, pad)
    return run


def timed_burst(run, reps: int, cycles: int) -> tuple[list[float], bool]:
    """Per-launch GPU times (ms) of `reps` launches queued behind a `cycles`-long sleep, and
    whether the sleep outlasted the queuing. An event recorded right after the sleep that has
    already completed once all launches are queued means the GPU caught up with the CPU, so
    CPU launch gaps may sit inside the timed brackets (the old sweep's up-to-60x outliers)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    torch.cuda._sleep(cycles)
    slept = torch.cuda.Event()
    slept.record()
    for start, end in events:
        start.record()
        run()
        end.record()
    clean = not slept.query()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events], clean


def time_conv(run, reps: int) -> dict:
    """Time one configuration; re-time it behind a longer sleep while the sleep ran out."""
    run()
    torch.cuda.synchronize()
    cycles, retries = SLEEP_CYCLES, 0
    times, clean = timed_burst(run, reps, cycles)
    while not clean and retries < GLITCH_RETRIES:
        cycles, retries = cycles * 4, retries + 1
        times, clean = timed_burst(run, reps, cycles)
    return dict(times_ms=times, latency_ms=statistics.median(times), sleep_cycles=cycles,
                glitch_retries=retries, timing_clean=clean)


def profile_chunk(chunk: list[tuple[int, object]]) -> dict[int, list[dict]]:
    """Run each configuration once under the profiler; return its kernels by config index."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for idx, run in chunk:
            with record_function(f"cfg{idx}"):
                run()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    return kernels_by_range(events)


def kernels_by_range(events: list[dict]) -> dict[int, list[dict]]:
    """Match GPU kernels to `cfg<i>` ranges via their launch's correlation id."""
    ranges = [(e["ts"], e["ts"] + e.get("dur", 0), int(e["name"][3:])) for e in events
              if e.get("cat") == "user_annotation" and e.get("name", "").startswith("cfg")]
    # cuDNN 9 launches through the driver API (cuLaunchKernelEx): both categories count.
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver")
                 and "correlation" in e.get("args", {})}
    gpu_ranges = [(e["ts"], e["ts"] + e.get("dur", 0), int(e["name"][3:])) for e in events
                  if e.get("cat") == "gpu_user_annotation"
                  and e.get("name", "").startswith("cfg")]
    out: dict[int, list[dict]] = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        ts = launch_ts.get(e.get("args", {}).get("correlation"))
        owner = next((i for lo, hi, i in ranges if ts is not None and lo <= ts <= hi), None)
        if owner is None:  # no launch record: fall back to the GPU-side range
            owner = next((i for lo, hi, i in gpu_ranges if lo <= e["ts"] <= hi), None)
        if owner is None:
            continue
        args = e["args"]
        out.setdefault(owner, []).append(dict(
            name=e["name"], dur_us=e.get("dur", 0.0), grid=args.get("grid"),
            block=args.get("block"), regs=args.get("registers per thread"),
            smem=args.get("shared memory")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="measuring order")
    ap.add_argument("--random-geometries", type=int, default=0, metavar="N",
                    help="N random draws of a layer geometry instead of the CASES")
    ap.add_argument("--geometry-seed", type=int, default=0)
    ap.add_argument("--pairs", type=int, default=8, help="(C, K) pairs per random draw")
    ap.add_argument("--with-cases", action="store_true",
                    help="with --random-geometries: the CASES too")
    ap.add_argument("--only", type=Path, default=None,
                    help="only the configurations of this earlier sweep.jsonl (a retest)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = False
    deadline = time.monotonic() + args.seconds
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfgs = configurations() if not args.random_geometries or args.with_cases else []
    if args.random_geometries:
        cfgs += random_configurations(args.random_geometries, args.geometry_seed, args.pairs)
    if args.only is not None:
        keep = {config_key(json.loads(line)) for line in args.only.read_text().splitlines()}
        cfgs = [c for c in cfgs if config_key(c) in keep]
    random.Random(args.seed).shuffle(cfgs)
    meta = dict(torch=torch.__version__, cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(), gpu=torch.cuda.get_device_name(),
                sms=torch.cuda.get_device_properties(0).multi_processor_count,
                cudnn_benchmark=False, allow_tf32=torch.backends.cudnn.allow_tf32,
                reps=args.reps, sleep_cycles=SLEEP_CYCLES,
                glitch_retries=GLITCH_RETRIES, n_planned=len(cfgs), seconds=args.seconds,
                seed=args.seed, random_geometries=args.random_geometries,
                geometry_seed=args.geometry_seed, pairs=args.pairs, with_cases=args.with_cases,
                only=str(args.only) if args.only else None)
    print(json.dumps(meta), flush=True)
    done = 0
    with open(out / "sweep.jsonl", "w") as sink:
        for lo in range(0, len(cfgs), args.chunk):
            if time.monotonic() > deadline:
                break
            chunk = [(lo + j, make_conv(c, "cuda")) for j, c in enumerate(cfgs[lo:lo + args.chunk])]
            times = {idx: time_conv(run, args.reps) for idx, run in chunk}
            kernels = profile_chunk(chunk)
            for idx, _ in chunk:
                row = dict(cfgs[idx], **times[idx], kernels=kernels.get(idx, []))
                sink.write(json.dumps(row) + "\n")
            sink.flush()
            done += len(chunk)
            del chunk
            torch.cuda.empty_cache()
            print(f"{done}/{len(cfgs)} configs", flush=True)
    meta["n_measured"] = done
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
