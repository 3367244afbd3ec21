"""Read LiteRT's GPU accelerator's own memory figures (ML Drift over WebGPU on the H100) for the
memory corpus and for single-op probes: `latpred.memory.gpu_measure.read_gpu_memory`.

Not a timing campaign: the figures are the accelerator's allocation sizes, deterministic, so
nothing else on the machine changes them. Models are written on the device machine from their
seeds (the same files as here: each row carries the file's sha256):

  . scripts/device_gpu.sh && python3 scripts/gpu_memory_campaign.py --out $OUT --workers 6

  --n-synthetic / --n-converter: samples of search_space/synthetic_cnn.yaml and converter_cnn.yaml
  (seed 0, as datasets/host-cpu-memory), the zoo (latpred zoo, seed 0), the committed converter
  fixtures, and the probes below; each in fp16 and fp32 -> $OUT/gpu_memory.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _one_input(name, hw, c, body):
    """A graph of one (1, hw, hw, c) input and what `body(builder, input)` returns."""
    from latpred.builder import GraphBuilder

    b = GraphBuilder(name)
    b.output(body(b, b.input((1, hw, hw, c))))
    return b.build()


def probe_graphs():
    """Single-op and two-op graphs that isolate one rule each (name, Graph)."""
    from latpred.builder import GraphBuilder

    out = []

    def add(name, hw, c, body):
        out.append((name, _one_input(name, hw, c, body)))

    for hw in (8, 32, 56):
        for cin in (3, 8, 16, 20, 32, 64, 96):
            for cout in (4, 8, 12, 16, 24, 32, 40, 64, 100, 128):
                for k in (1, 3):
                    add(f"conv{k}_{hw}_{cin}_{cout}", hw, cin,
                        lambda b, x, cout=cout, k=k: b.conv2d(x, cout, k))
    for cin, cout in ((64, 64), (128, 128), (256, 256), (32, 96)):
        for k, s in ((3, 2), (5, 1), (7, 2)):
            add(f"conv{k}s{s}_28_{cin}_{cout}", 28, cin,
                lambda b, x, cout=cout, k=k, s=s: b.conv2d(x, cout, k, stride=s))
    for c in (8, 16, 24, 32, 72, 96, 144):
        for k in (3, 5, 7):
            add(f"dw{k}_28_{c}", 28, c, lambda b, x, k=k: b.depthwise_conv2d(x, k))
    for cin, cout in ((64, 10), (256, 100), (1000, 1001), (20, 7), (1280, 1000)):
        b = GraphBuilder(f"fc_{cin}_{cout}")
        x = b.input((1, cin))
        b.output(b.fully_connected(x, cout))
        out.append((f"fc_{cin}_{cout}", b.build()))
    for hw, c in ((8, 3), (8, 4), (16, 5), (32, 16), (32, 30), (56, 64)):
        add(f"relu_{hw}_{c}", hw, c, lambda b, x: b.relu(x))
        add(f"relu2_{hw}_{c}", hw, c, lambda b, x: b.sigmoid(b.relu(b.conv2d(x, c, 1))))
        add(f"chain3_{hw}_{c}", hw, c,
            lambda b, x, c=c: b.conv2d(b.conv2d(b.conv2d(x, c, 3), c, 3), c, 3))
        add(f"addx_{hw}_{c}", hw, c, lambda b, x, c=c: b.add(b.conv2d(x, c, 1), x))
        add(f"mean_{hw}_{c}", hw, c, lambda b, x: b.mean(x))
        add(f"avgpool_{hw}_{c}", hw, c, lambda b, x: b.avg_pool(x, 2))
        add(f"maxpool_{hw}_{c}", hw, c, lambda b, x: b.max_pool(x, 3, 2))
        add(f"concat_{hw}_{c}", hw, c,
            lambda b, x, c=c: b.concat([b.conv2d(x, c, 1), b.conv2d(x, 8, 1)]))
        add(f"pad_{hw}_{c}", hw, c, lambda b, x: b.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]))
        add(f"se_{hw}_{c}", hw, c, lambda b, x: b.squeeze_excite(x))
    return out


def probe_graphs_thin():
    """Chains the delegate's special kernels may fuse (depthwise + 1x1, thin stems) and grouped
    convolutions (name, Graph)."""
    out = []

    def add(name, hw, c, body):
        out.append((name, _one_input(name, hw, c, body)))

    for hw in (28, 56, 112):
        for c in (8, 16, 24, 32, 48, 64, 96):
            for cout in (8, 16, 32, 64):
                add(f"dwpw_{hw}_{c}_{cout}", hw, c,
                    lambda b, x, cout=cout: b.conv2d(b.depthwise_conv2d(x, 3, activation="RELU6"),
                                                     cout, 1, activation="RELU6"))
            add(f"pwdwpw_{hw}_{c}", hw, c,
                lambda b, x, c=c: b.conv2d(b.depthwise_conv2d(b.conv2d(x, 4 * c, 1), 3), c, 1))
            add(f"dwdw_{hw}_{c}", hw, c,
                lambda b, x: b.depthwise_conv2d(b.depthwise_conv2d(x, 3), 3))
            add(f"dws2pw_{hw}_{c}", hw, c,
                lambda b, x, c=c: b.conv2d(b.depthwise_conv2d(x, 3, stride=2), 2 * c, 1))
            add(f"pwpw_{hw}_{c}", hw, c, lambda b, x, c=c: b.conv2d(b.conv2d(x, c, 1), c, 1))
        add(f"stem_{hw}", hw * 2, 3, lambda b, x: b.conv2d(
            b.depthwise_conv2d(b.conv2d(x, 8, 3, stride=2), 3), 16, 1))
        for c, g in ((32, 2), (32, 4), (64, 8), (56, 8), (96, 3), (128, 32)):
            add(f"gconv_{hw}_{c}_{g}", hw, c, lambda b, x, c=c, g=g: b.conv2d(x, c, 3, groups=g))
            add(f"gconv1_{hw}_{c}_{g}", hw, c, lambda b, x, c=c, g=g: b.conv2d(x, c, 1, groups=g))
    return out


def probe_graphs_groups():
    """Grouped convolutions ML Drift splits into one convolution a group (channels a group not
    both multiples of 4), alone and between two 1x1 convolutions, with at most 4 input channels
    a group (more crash the accelerator: latpred.deduce.rulesets) (name, Graph)."""
    out = []

    def add(name, hw, c, body):
        out.append((name, _one_input(name, hw, c, body)))

    for hw in (14, 56, 112):
        for g in (2, 3, 4, 8, 16):
            for ci in (1, 2, 3, 4):
                for co in (1, 2, 3, 5, 6, 7):
                    if ci == co == 1:
                        continue    # a depthwise convolution
                    add(f"gsplit_{hw}_{g}_{ci}_{co}", hw, g * ci,
                        lambda b, x, g=g, co=co: b.conv2d(x, g * co, 3, groups=g))
                    add(f"gsplitc_{hw}_{g}_{ci}_{co}", hw, 8,
                        lambda b, x, g=g, ci=ci, co=co: b.conv2d(b.conv2d(
                            b.conv2d(x, g * ci, 1), g * co, 3, groups=g), 16, 1))
    return out


def probe_graphs_wide():
    """Graph CONCATENATIONs of 3 to 17 inputs (one with an ADD linked in) and SPLITs into 8
    to 32 parts: the chains `memory.gpu_flat.wide_chains` found on grouped convolutions,
    on the graph's own ops (name, Graph)."""
    out = []

    def add(name, hw, c, body):
        out.append((name, _one_input(name, hw, c, body)))

    for hw in (14, 56):
        for n in (3, 4, 5, 6, 7, 8, 9, 12, 16, 17):
            for c in (4, 6):
                add(f"wconcat_{hw}_{n}_{c}", hw, 8, lambda b, x, n=n, c=c: b.concat(
                    [b.conv2d(x, c + (k % 3), 1) for k in range(n)]))
            add(f"wconcatadd_{hw}_{n}", hw, 8, lambda b, x, n=n: _concat_add(b, x, n))
        for n in (8, 14, 15, 16, 17, 20, 30, 32):
            add(f"wsplit_{hw}_{n}", hw, 4 * n, lambda b, x, n=n: b.concat(
                [b.conv2d(p, 8, 1) for p in b.split(x, n)]))
    return out


def probe_graphs_small():
    """Convolutions on small maps (1 to 7 pixels square), where ML Drift may keep weights as
    constant tensors (name, Graph)."""
    out = []
    for hw in range(1, 8):
        for k in (1, 3):
            for cin, cout in ((16, 16), (56, 336), (112, 1280), (20, 30), (64, 100)):
                name = f"small{k}_{hw}_{cin}_{cout}"
                out.append((name, _one_input(name, hw, cin,
                                             lambda b, x, cout=cout, k=k: b.conv2d(x, cout, k))))
    return out


def probe_graphs_winograd():
    """3x3 convolutions ML Drift runs as Winograd, over output sizes and channels where the
    matmul's output slice group (`memory.gpu_weights.winograd_output_group`) is 1, 2 or 4,
    and fully-connected kernels (and 1x1 convolutions on a 2x2 map, run as one) without a
    bias (name, Graph)."""
    from latpred.builder import GraphBuilder

    out = []
    for hw in (24, 32, 34, 40, 48, 52, 56, 64):
        for cin in (64, 66):
            for cout in (66, 76, 100, 132, 200):
                name = f"wino_{hw}_{cin}_{cout}"
                out.append((name, _one_input(name, hw, cin,
                                             lambda b, x, cout=cout: b.conv2d(x, cout, 3))))
    for cin, cout in ((64, 10), (256, 100), (20, 7), (1280, 1000)):
        name = f"fcnb_{cin}_{cout}"
        b = GraphBuilder(name)
        b.output(b.fully_connected(b.input((1, cin)), cout, bias=False))
        out.append((name, b.build()))
        name = f"smallnb_2_{cin}_{cout}"
        out.append((name, _one_input(name, 2, cin, lambda b, x, cout=cout: _conv_no_bias(
            b, x, cout))))
    return out


def probe_graphs_wave():
    """Winograd convolutions whose input slices are a multiple of 4 and output slices of 8,
    where ML Drift may take ConvWaveMatrix for the matmul in fp16 instead of ConvGeneric
    (convolution_selector.cc; conv_wave_matrix.cc) (name, Graph)."""
    out = []
    for hw in (24, 40, 56):
        for cin in (64, 128):
            for cout in (96, 160, 224, 288):
                name = f"wave_{hw}_{cin}_{cout}"
                out.append((name, _one_input(name, hw, cin,
                                             lambda b, x, cout=cout: b.conv2d(x, cout, 3))))
    return out


def _conv_no_bias(b, x, cout):
    """A 1x1 CONV_2D without a bias tensor (-1), which GraphBuilder no longer writes: LiteRT
    does not run it (run 7: compile status 3 on the GPU accelerator)."""
    base = b._base(None, "conv2d")
    w = b.constant((cout, 1, 1, b.shape(x)[-1]), name=f"{base}/filter")
    return b._op("CONV_2D", (x, w, -1), base, stride=(1, 1), padding="SAME",
                 dilation=(1, 1), activation="NONE", groups=1)[0]


def _concat_add(b, x, n):
    """An ADD the delegate links into the concatenation: its other operand written first."""
    y = b.conv2d(x, 4 * n, 1)
    return b.add(b.concat([b.conv2d(x, 4, 1) for _ in range(n)]), y)


def probe_graphs_crash():
    """Split grouped convolutions with 5 to 8 input channels a group, which the rule says crash
    the accelerator; each is measured in a process of its own (`--crash-probes`)."""
    return [(f"gcrash_{hw}_{g}_{ci}_{co}",
             _one_input(f"gcrash_{hw}_{g}_{ci}_{co}", hw, g * ci,
                        lambda b, x, g=g, co=co: b.conv2d(x, g * co, 3, groups=g)))
            for hw in (14, 56) for g in (2, 8) for ci in (5, 6, 8) for co in (3, 5)]


def _isolated(job: dict, queue) -> None:
    queue.put(_measure(job))


def _measure_isolated(jobs: list[dict], f) -> None:
    """Each job in a fresh process, so a crash is recorded with its exit code."""
    ctx = mp.get_context("spawn")
    for job in jobs:
        queue = ctx.Queue()
        proc = ctx.Process(target=_isolated, args=(job, queue))
        proc.start()
        proc.join(120)
        if proc.is_alive():
            proc.kill()
            proc.join()
        row = queue.get() if not queue.empty() else dict(
            job, model=Path(job["path"]).stem, error=f"exit code {proc.exitcode}",
            sha256=hashlib.sha256(Path(job["path"]).read_bytes()).hexdigest())
        f.write(json.dumps(row) + "\n")
        f.flush()
        print(row.get("model"), row.get("intermediate"), row.get("error", ""), flush=True)


def _write_models(models: Path, n_syn: int, n_conv: int, seed: int = 0) -> list[dict]:
    from latpred.sampler import load_space, write_samples
    from latpred.zoo import write_models

    rows = [{"path": str(p), "source": "corpus"}
            for p in sorted((ROOT / "tests" / "fixtures" / "corpus").glob("*.tflite"))]
    for space, n, tag in (("synthetic_cnn", n_syn, "synthetic"),
                          ("converter_cnn", n_conv, "converter")):
        if n:
            d = models / tag
            write_samples(load_space(ROOT / "search_space" / f"{space}.yaml"), n, seed, d,
                          "fp32")
            rows += [{"path": str(p), "source": tag} for p in sorted(d.glob("*.tflite"))[:n]]
    write_models(models / "zoo", precision="fp32", seed=0)
    rows += [{"path": str(p), "source": "zoo"} for p in sorted((models / "zoo").glob("*.tflite"))]
    return rows + _write_probes(models, (*probe_graphs(), *probe_graphs_thin()))


def _write_probes(models: Path, graphs, source: str = "probe") -> list[dict]:
    from latpred.tflite import write_tflite

    rows = []
    (models / "probe").mkdir(parents=True, exist_ok=True)
    for name, g in graphs:
        p = models / "probe" / f"{name}.tflite"
        p.write_bytes(write_tflite(g))
        rows.append({"path": str(p), "source": source})
    return rows


def _measure(job: dict) -> dict:
    from latpred.memory.gpu_measure import read_gpu_memory

    row = dict(job, model=Path(job["path"]).stem,
               sha256=hashlib.sha256(Path(job["path"]).read_bytes()).hexdigest())
    t = time.time()
    try:
        r = read_gpu_memory(job["path"], job["precision"])
        row.update(intermediate=r.intermediate, constant=r.constant,
                   fully_accelerated=r.fully_accelerated, metrics=r.metrics)
    except Exception as e:  # recorded as what it is; the campaign goes on
        row["error"] = f"{type(e).__name__}: {e}"
    row["seconds"] = round(time.time() - t, 3)
    return row


# --probe-set NAME: (the graphs, the rows' source)
PROBE_SETS = {"thin": (probe_graphs_thin, "probe"), "groups": (probe_graphs_groups, "group_probe"),
              "wide": (probe_graphs_wide, "wide_probe"), "small": (probe_graphs_small, "small_probe"),
              "winograd": (probe_graphs_winograd, "wino_probe"),
              "wave": (probe_graphs_wave, "wave_probe")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="/tmp/gpu-memory-models")
    ap.add_argument("--n-synthetic", type=int, default=40)
    ap.add_argument("--n-converter", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0, help="of the synthetic and converter samples")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--precisions", default="fp16,fp32")
    ap.add_argument("--only", default="", help="comma-separated sources to measure")
    ap.add_argument("--probe-set", choices=sorted(PROBE_SETS),
                    help="only this probe set (without the memory corpus)")
    ap.add_argument("--crash-probes", action="store_true",
                    help="only probe_graphs_crash, each in a process of its own")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.crash_probes:
        rows = _write_probes(Path(a.models), probe_graphs_crash(), "group_probe")
        with open(out / "gpu_memory.jsonl", "a") as f:
            _measure_isolated([dict(r, precision=p) for p in a.precisions.split(",")
                               for r in rows], f)
        return
    if a.probe_set:
        graphs, source = PROBE_SETS[a.probe_set]
        rows = _write_probes(Path(a.models), graphs(), source)
    else:
        rows = _write_models(Path(a.models), a.n_synthetic, a.n_converter, a.seed)
    if a.only:
        rows = [r for r in rows if r["source"] in a.only.split(",")]
    jobs = [dict(r, precision=p) for p in a.precisions.split(",") for r in rows]
    print(f"{len(jobs)} readings", flush=True)
    with mp.get_context("spawn").Pool(a.workers, maxtasksperchild=40) as pool, \
            open(out / "gpu_memory.jsonl", "a") as f:
        for i, row in enumerate(pool.imap_unordered(_measure, jobs)):
            f.write(json.dumps(row) + "\n")
            f.flush()
            if i % 50 == 0:
                print(i, row.get("model"), row.get("intermediate"), row.get("constant"),
                      row.get("error", ""), flush=True)


if __name__ == "__main__":
    main()
