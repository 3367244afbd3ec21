"""NAS spaces, the sampler, build_graph and `latpred sample`."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from latpred.errors import ConfigError
from latpred.sampler import (build_graph, load_space, model_id, parse_space, sample,
                             sample_one)

SPACES = Path(__file__).parents[1] / "search_space"
SYNTHETIC = SPACES / "synthetic_cnn.yaml"
RESIDUAL = SPACES / "mnasnet_residual.yaml"


def raw(path: Path = SYNTHETIC) -> dict:
    return yaml.safe_load(path.read_text())


def resolutions(arch: dict) -> list[int]:
    """Spatial size after each block (SAME padding: ceil division by the stride)."""
    h = arch["input"][0] // arch["stem"]["stride"]
    out = []
    for layer in arch["blocks"]:
        h = -(-h // layer.get("stride", 1))
        out.append(h)
    return out


def channel_flow(arch: dict) -> list[tuple[int, int]]:
    """(input, output) channels of each block."""
    c, flow = arch["stem"]["channels"], []
    for layer in arch["blocks"]:
        out = layer.get("channels", c)
        flow.append((c, out))
        c = out
    return flow


# -- the synthetic space reproduces the paper --------------------------------------------------
def test_synthetic_space_is_the_papers():
    space = load_space(SYNTHETIC)
    assert space.input == (224, 224, 3) and len(space.stages) == 9
    assert set(space.blocks) == {"conv", "dwsep", "bottleneck", "pool", "split"}
    for stage in space.stages[:5]:
        assert min(stage.channels) == 8 and max(stage.channels) == 80
    for stage in space.stages[5:]:
        assert min(stage.channels) == 80 and max(stage.channels) == 400
    assert min(space.head_channels) == 1200 and max(space.head_channels) == 1800
    b = space.blocks
    assert b["conv"]["kernel"] == b["dwsep"]["kernel"] == b["bottleneck"]["kernel"] == (3, 5, 7)
    assert b["conv"]["group_size"] == tuple(4 * k for k in range(1, 17))
    assert b["bottleneck"]["expansion"] == (1, 3, 6) and set(b["bottleneck"]["se"]) == {0, 1}
    assert b["pool"]["size"] == (1, 3) and set(b["pool"]["kind"]) == {"avg", "max"}
    assert b["split"]["parts"] == (2, 3, 4)
    assert [s.stride for s in space.stages] == [1, 2, 2, 1, 2, 1, 2, 1, 1]


def test_synthetic_samples_respect_every_constraint():
    space = load_space(SYNTHETIC)
    archs = sample(space, 300, seed=7)
    types, kernels = Counter(), Counter()
    for arch in archs:
        assert len(arch["blocks"]) == 9
        assert 1200 <= arch["head"]["channels"] <= 1800
        assert resolutions(arch)[-1] in (7, 14)  # 14 only when a split swallowed a stride
        for i, (layer, (cin, cout)) in enumerate(zip(arch["blocks"], channel_flow(arch))):
            types[layer["type"]] += 1
            assert not layer["residual"]
            if layer["type"] in ("pool", "split"):
                assert cout == cin
                continue
            kernels[layer["kernel"]] += 1
            low, high = (8, 80) if i < 5 else (80, 400)
            assert low <= cout <= high and cout % 8 == 0
            if layer["type"] == "conv" and layer["groups"] > 1:
                group_size = cin // layer["groups"]
                assert cin % layer["groups"] == 0 and cout % layer["groups"] == 0
                assert group_size % 4 == 0 and 4 <= group_size <= 64
    assert set(types) == {"conv", "dwsep", "bottleneck", "pool", "split"}
    assert min(types.values()) > 0.15 * 9 * 300  # uniform: each type about 20%
    assert set(kernels) == {3, 5, 7}
    grouped = [l for a in archs for l in a["blocks"] if l["type"] == "conv" and l["groups"] > 1]
    assert len(grouped) > 0.3 * types["conv"]


def test_split_blocks_hand_their_stride_to_the_next_block():
    data = raw()
    data["stages"] = [{"stride": 2, "channels": [16], "blocks": ["split"]},
                      {"stride": 1, "channels": [16], "blocks": ["split"]},
                      {"stride": 1, "channels": [16], "blocks": ["pool"]},
                      {"stride": 2, "channels": [16], "blocks": ["split"]}]
    arch = sample_one(parse_space(data), seed=0, index=0)
    assert [l.get("stride") for l in arch["blocks"]] == [None, None, 2, None]
    assert resolutions(arch) == [112, 112, 56, 56]  # the last stride had no block to take it


def test_sampling_is_deterministic_and_seeded():
    space = load_space(SYNTHETIC)
    first = sample(space, 20, seed=3)
    assert first == sample(space, 20, seed=3)
    assert first[:5] == sample(space, 5, seed=3)
    assert first[11] == sample_one(space, 3, 11)
    assert sample(SYNTHETIC, 2, seed=3) == first[:2]  # a path works as well
    assert first != sample(space, 20, seed=4)
    assert len({json.dumps(a["blocks"]) for a in first}) == 20
    assert json.loads(json.dumps(first)) == first  # plain JSON values only
    assert (first[11]["space"], first[11]["seed"], first[11]["index"]) == ("synthetic_cnn", 3, 11)
    assert model_id("synthetic_cnn", 3, 11) == "synthetic_cnn-s3-00011"


def test_residual_space_has_repeats_and_residual_adds():
    space = load_space(RESIDUAL)
    archs = sample(space, 200, seed=1)
    n_residual = 0
    for arch in archs:
        assert 1 + 1 + 2 + 3 + 2 + 2 + 1 <= len(arch["blocks"]) <= 2 + 3 + 4 + 5 + 4 + 4 + 2
        assert resolutions(arch)[-1] == 7 and arch["head"]["channels"] == 1280
        for layer, (cin, cout) in zip(arch["blocks"], channel_flow(arch)):
            assert layer["type"] in ("conv", "dwsep", "bottleneck")
            if layer["residual"]:
                assert layer["stride"] == 1 and cin == cout
                n_residual += 1
    assert n_residual > 0.2 * sum(len(a["blocks"]) for a in archs)


# -- validation --------------------------------------------------------------------------------
def _set(path: str, value):
    def change(data: dict) -> dict:
        data = copy.deepcopy(data)
        *keys, last = path.split(".")
        node = data
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is _DELETE:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
        return data
    return change


_DELETE = object()


@pytest.mark.parametrize("change, message", [
    (_set("name", _DELETE), "missing key.*name"),
    (_set("name", "bad name!"), "'name' must be a word"),
    (_set("colour", "red"), "unknown key.*colour"),
    (_set("input", [224, 224]), "'input' must be"),
    (_set("stages.2.stride", 3), "stage 3: stride must be 1 or 2"),
    (_set("stages.0.channels", {"min": 81, "max": 87}), "no multiple of 8"),
    (_set("stages.0.channels", {"min": 8}), "missing key.*max"),
    (_set("stages", []), "'stages' must be a non-empty list"),
    (_set("stages.0.blocks", ["transformer"]), "'blocks' must be a non-empty list drawn from"),
    (_set("blocks.transformer", {"heads": [4]}), "unknown key.*transformer"),
    (_set("blocks.conv.kernel", [3, 4]), "odd kernel sizes"),
    (_set("blocks.conv.kernel", _DELETE), "block 'conv': missing key.*kernel"),
    (_set("blocks.conv.group_size", [0, 4]), "'group_size' must be a non-empty list of integ"),
    (_set("blocks.bottleneck.se", ["yes"]), "'se' must be a non-empty list of true/false"),
    (_set("blocks.split.parts", [1, 2]), "'parts' must be a non-empty list of integers >= 2"),
    (_set("blocks.split.elementwise", ["relu", "gelu"]), "'elementwise' must be"),
    (_set("blocks.pool.kind", ["min"]), "'kind' must be"),
    (_set("head.softmax", "yes"), "'softmax' must be true or false"),
    (_set("activation", "GELU"), "'activation' must be one of"),
    (_set("skip", ["pooling"]), "'skip' must be"),
])
def test_bad_spaces_are_refused_with_a_clear_sentence(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_space(change(raw()), "space.yaml")


def test_unreadable_space_files(tmp_path):
    with pytest.raises(ConfigError, match="Cannot read search space"):
        load_space(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_space(bad)
    bad.write_text("- just a list")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_space(bad)


def test_negative_seed_or_count_is_refused():
    with pytest.raises(ConfigError, match="non-negative"):
        sample(load_space(SYNTHETIC), 3, seed=-1)


# -- building ----------------------------------------------------------------------------------
def _expected_counts(arch: dict) -> Counter:
    n = Counter(CONV_2D=2, FULLY_CONNECTED=1, SOFTMAX=1, MEAN=1)  # stem, head conv, head
    for layer in arch["blocks"]:
        t = layer["type"]
        if t == "conv":
            n["CONV_2D"] += 1
        elif t == "dwsep":
            n.update(DEPTHWISE_CONV_2D=1, CONV_2D=1)
        elif t == "bottleneck":
            n.update(DEPTHWISE_CONV_2D=1, CONV_2D=1 + (layer["expansion"] != 1))
            if layer["se"]:
                n.update(MEAN=1, CONV_2D=2, LOGISTIC=1, MUL=1)
        elif t == "pool":
            n["AVERAGE_POOL_2D" if layer["kind"] == "avg" else "MAX_POOL_2D"] += 1
        else:
            n.update(CONCATENATION=1, SPLIT=0)
            for op in layer["elementwise"]:
                n[{"relu": "RELU", "relu6": "RELU6", "sigmoid": "LOGISTIC", "tanh": "TANH",
                   "hard_swish": "HARD_SWISH", "add": "ADD", "mul": "MUL"}[op]] += 1
        n["ADD"] += layer["residual"]
    return +n


@pytest.mark.parametrize("path", [SYNTHETIC, RESIDUAL])
def test_build_graph_follows_the_description(path):
    for arch in sample(load_space(path), 15, seed=11):
        graph = build_graph(arch)
        assert graph.name == model_id(arch["space"], 11, arch["index"])
        assert graph.tensors[graph.inputs[0]].shape == (1, 224, 224, 3)
        assert graph.tensors[graph.outputs[0]].shape == (1, 1000)
        counts = Counter(graph.op_types())
        splits = counts.pop("SPLIT", 0) + counts.pop("SPLIT_V", 0)
        assert splits == sum(layer["type"] == "split" for layer in arch["blocks"])
        assert counts == _expected_counts(arch)
        convs = [op for op in graph.ops if op.type == "CONV_2D"]
        wanted = [l["groups"] for l in arch["blocks"] if l["type"] == "conv"]
        assert sorted(g for g in (op.attr("groups", 1) for op in convs) if g > 1) == \
            sorted(g for g in wanted if g > 1)
        last_conv = graph.tensors[convs[-1].outputs[0]].shape
        assert last_conv[-1] == arch["head"]["channels"]
        assert last_conv[1] == resolutions(arch)[-1]


def test_build_graph_uses_split_v_when_parts_do_not_divide():
    data = raw()
    data["stages"] = [{"stride": 1, "channels": [16], "blocks": ["split"]}]
    data["blocks"]["split"] = {"parts": [3], "elementwise": ["add"]}
    graph = build_graph(sample_one(parse_space(data), 0, 0))  # the stem makes 32 channels
    split = next(op for op in graph.ops if op.type == "SPLIT_V")
    assert [graph.tensors[t].shape[-1] for t in split.outputs] == [11, 11, 10]
    adds = [op for op in graph.ops if op.type == "ADD"]
    assert len(adds) == 3 and graph.tensors[adds[0].inputs[1]].is_constant


def test_built_models_run_on_litert():
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    import numpy as np

    from latpred.tflite import write_tflite

    for path in (SYNTHETIC, RESIDUAL):
        graph = build_graph(sample_one(load_space(path), 0, 2))
        interpreter = litert.Interpreter(model_content=write_tflite(graph), num_threads=1)
        interpreter.allocate_tensors()
        image = np.random.default_rng(0).standard_normal((1, 224, 224, 3), dtype=np.float32)
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], image)
        interpreter.invoke()
        out = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        assert out.shape == (1, 1000) and np.isclose(out.sum(), 1.0, atol=1e-3)


@pytest.mark.parametrize("change", [
    lambda a: a.pop("blocks"),
    lambda a: a["blocks"][0].update(type="attention"),
    lambda a: a["blocks"][0].pop("residual"),
    lambda a: a.update(input="224x224"),
])
def test_malformed_descriptions_are_refused(change):
    arch = sample_one(load_space(SYNTHETIC), 0, 0)
    change(arch)
    with pytest.raises(ConfigError, match="Malformed architecture"):
        build_graph(arch)


# -- latpred sample ----------------------------------------------------------------------------
def _run(*args: str):
    from click.testing import CliRunner

    from latpred.cli import main

    return CliRunner().invoke(main, ["sample", *args])


def test_cli_sample_writes_identical_files_for_a_seed(tmp_path):
    for out in ("a", "b"):
        result = _run("--space", str(SYNTHETIC), "--n", "3", "--seed", "5",
                      "--out", str(tmp_path / out))
        assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(f"synthetic_cnn-s5-0000{i}.{ext}" for i in range(3)
                           for ext in ("json", "tflite"))
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    arch = json.loads((tmp_path / "a" / "synthetic_cnn-s5-00001.json").read_text())
    assert arch == sample_one(load_space(SYNTHETIC), 5, 1)
    from latpred.tflite import read_tflite

    graph = read_tflite(tmp_path / "a" / "synthetic_cnn-s5-00001.tflite")
    assert graph.op_types() == build_graph(arch).op_types()
    other = _run("--space", str(SYNTHETIC), "--n", "1", "--seed", "6", "--out", str(tmp_path / "c"))
    assert other.exit_code == 0
    assert (tmp_path / "c" / "synthetic_cnn-s6-00000.tflite").read_bytes() != \
        (tmp_path / "a" / "synthetic_cnn-s5-00000.tflite").read_bytes()


def test_cli_sample_int8(tmp_path):
    pytest.importorskip("latpred.tflite.quantize")
    from latpred.tflite import read_tflite

    result = _run("--space", str(RESIDUAL), "--n", "1", "--out", str(tmp_path), "--precision",
                  "int8")
    assert result.exit_code == 0, result.output
    graph = read_tflite(tmp_path / "mnasnet_residual-s0-00000.tflite")
    assert any(t.dtype == "int8" for t in graph.tensors)


def test_cli_sample_reports_a_bad_space_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SYNTHETIC.read_text().replace("stride: 2,", "stride: 3,"))
    result = _run("--space", str(bad), "--n", "1", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "stride must be 1 or 2" in result.output and "Traceback" not in result.output


# -- the converter-idiom space -------------------------------------------------------------------
CONVERTER = SPACES / "converter_cnn.yaml"
CORPUS_FIXTURES = Path(__file__).parent / "fixtures" / "corpus"


def test_converter_space_samples_every_idiom_the_converter_writes():
    graphs = [build_graph(a) for a in sample(CONVERTER, 60, 0)]
    ops = Counter(op.type for g in graphs for op in g.ops)
    for op_type in ("SHAPE", "STRIDED_SLICE", "PACK", "RESHAPE", "HARD_SWISH", "LOGISTIC",
                    "MUL", "PAD", "MEAN", "DEPTHWISE_CONV_2D", "ADD"):
        assert ops[op_type] > 0, op_type
    # PAD feeds a VALID convolution; some depthwise convolutions have a multiplier of 2;
    # some MEANs drop the spatial axes (Keras's GlobalAveragePooling2D before a Reshape).
    pads_into_valid = depth_multiplied = flat_means = 0
    for g in graphs:
        for op in g.ops:
            if op.type in ("CONV_2D", "DEPTHWISE_CONV_2D") and op.attr("padding") == "VALID":
                pads_into_valid += any(p.type == "PAD" and op.inputs[0] in p.outputs
                                       for p in g.ops)
            depth_multiplied += op.type == "DEPTHWISE_CONV_2D" and op.attr("depth_multiplier") == 2
            flat_means += op.type == "MEAN" and not op.attr("keep_dims")
    assert pads_into_valid and depth_multiplied and flat_means > len(graphs)


def test_dynamic_reshape_is_the_converters_chain():
    from latpred.builder import GraphBuilder
    from latpred.tflite import read_tflite

    real = read_tflite(CORPUS_FIXTURES / "fx_efficientnet_tiny_96.tflite")
    b = GraphBuilder()
    x = b.mean(b.input((1, 8, 8, 24)), (1, 2), keep_dims=False)
    b.output(b.dynamic_reshape(x, (1, 1, 1, 24)))
    mine = b.build()

    def chain(g):
        ops = [op for op in g.ops if op.type in ("SHAPE", "STRIDED_SLICE", "PACK", "RESHAPE")]
        return [(op.type, op.attrs, [g.tensors[t].dtype for t in op.inputs],
                 [g.tensors[t].is_constant for t in op.inputs]) for op in ops[:4]]

    assert chain(mine) == chain(real)


def test_converter_space_models_run_on_litert_and_read_back():
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    import numpy as np

    from latpred.tflite import read_tflite, write_tflite

    for arch in sample(CONVERTER, 8, 1):
        graph = build_graph(arch)
        data = write_tflite(graph)
        assert [op.type for op in read_tflite(data).ops] == [op.type for op in graph.ops]
        interpreter = litert.Interpreter(model_content=data, num_threads=1)
        interpreter.allocate_tensors()
        shape = interpreter.get_input_details()[0]["shape"]
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"],
                               np.zeros(shape, np.float32))
        interpreter.invoke()
        out = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        assert out.shape == graph.tensors[graph.outputs[0]].shape


def test_older_spaces_draw_no_idiom_keys():
    # Architecture files of the shipped datasets must rebuild unchanged.
    for path in (SYNTHETIC, RESIDUAL):
        for arch in sample(path, 20, 0):
            for layer in arch["blocks"]:
                assert not {"act", "pad", "depth_multiplier", "se_style", "se_gate"} & set(layer)


def test_convnext_block_is_the_converters_sequence():
    # Keras 3's ConvNeXt block as TensorFlow 2.21 converted it (fx_convnext_mini_64), against
    # the sampler's: op types, attributes and which operands are constants, op for op.
    from latpred.builder import GraphBuilder
    from latpred.sampler.build import _convnext
    from latpred.tflite import read_tflite

    real = read_tflite(CORPUS_FIXTURES / "fx_convnext_mini_64.tflite")
    b = GraphBuilder()
    x = b.input((1, 16, 16, 16))
    b.output(_convnext(b, x, {"kernel": 7, "expansion": 4}, "RELU6", 16))
    mine = b.build()

    def block(g, start):
        return [(op.type, dict(op.attrs).get("keep_dims"), dict(op.attrs).get("axis"),
                 [g.tensors[t].is_constant for t in op.inputs if t >= 0])
                for op in g.ops[start:start + len(mine.ops)]]

    first_dw = next(i for i, op in enumerate(real.ops) if op.type == "CONV_2D" and i > 0)
    assert block(mine, 0) == block(real, first_dw)


SCALED = SPACES / "converter_scaled.yaml"


def test_make_divisible_rounds_as_keras_applications():
    from latpred.sampler import make_divisible

    # keras.applications.mobilenet_v2._make_divisible(v, 8): MobileNetV2 0.35's 32-channel stem
    # is 16, 0.75's 24; 1.4's 1280-channel head is 1792; 0.35 of 24 is 8; never 10% below.
    assert make_divisible(32 * 0.35, 8) == 16
    assert make_divisible(32 * 0.75, 8) == 24
    assert make_divisible(1280 * 1.4, 8) == 1792
    assert make_divisible(24 * 0.35, 8) == 8
    assert make_divisible(92, 8) == 96 and make_divisible(84, 8) == 88


def test_scaled_space_draws_resolutions_widths_and_fits_its_flops_budget():
    from latpred.sampler import load_space
    from latpred.sampler.draw import _flops

    space = load_space(SCALED)
    archs = sample(space, 80, 3)
    assert {a["input"][0] for a in archs} == set(space.resolutions)
    assert {a["width"] for a in archs} == set(space.widths)
    assert all(_flops(a) <= space.max_flops for a in archs)
    for a in archs:   # every channel count is the scaled one, a multiple of 8
        assert a["stem"]["channels"] % 8 == 0 and a["head"]["channels"] % 8 == 0
        assert all(b.get("channels", 8) % 8 == 0 for b in a["blocks"])
    thin = [a for a in archs if a["width"] == 0.25]
    wide = [a for a in archs if a["width"] == 3.0]
    assert max(b.get("channels", 0) for a in thin for b in a["blocks"]) <= 80
    assert max(b.get("channels", 0) for a in wide for b in a["blocks"]) > 320
    # Deterministic in (space, seed, index), redraws included.
    assert sample(space, 80, 3) == archs


def test_scaled_space_pools_may_be_zero_padded_and_valid():
    graphs = [build_graph(a) for a in sample(SCALED, 80, 0)]
    padded_pools = [op for g in graphs for op in g.ops
                    if op.type in ("MAX_POOL_2D", "AVERAGE_POOL_2D")
                    and op.attr("padding") == "VALID"
                    and any(p.type == "PAD" and op.inputs[0] in p.outputs for p in g.ops)]
    assert padded_pools


def test_a_flops_budget_nothing_fits_is_one_clear_error():
    from latpred.sampler import load_space
    import dataclasses

    space = dataclasses.replace(load_space(SCALED), max_flops=1.0)
    with pytest.raises(ConfigError, match="max_flops"):
        sample(space, 1, 0)


def test_spaces_without_scaling_sample_as_before():
    # converter_cnn has no resolution/width keys: its draws keep the fixed input, no "width".
    archs = sample(CONVERTER, 20, 0)
    assert all(a["input"] == [192, 192, 3] and "width" not in a for a in archs)


@pytest.mark.parametrize("dataset, space", [("host-cpu-converter", "converter_cnn"),
                                            ("host-cpu-synthetic", "synthetic_cnn")])
def test_shipped_datasets_are_still_the_samplers_draws(dataset, space):
    import pandas as pd

    rows = pd.read_parquet(Path(__file__).parents[1] / "datasets" / dataset / "models.parquet",
                           columns=["arch"])
    archs = [json.loads(a) for a in rows["arch"][:30]]
    drawn = sample(SPACES / f"{space}.yaml", max(a["index"] for a in archs) + 1, archs[0]["seed"])
    assert all(drawn[a["index"]] == a for a in archs)


def test_a_flops_window_keeps_draws_between_its_bounds():
    from latpred.sampler import load_space
    from latpred.sampler.draw import _flops

    space = load_space(SPACES / "converter_large.yaml")
    flops = [_flops(a) for a in sample(space, 6, 1)]
    assert all(space.min_flops <= f <= space.max_flops for f in flops)


# -- RegNet's design space (search_space/regnet_cnn.yaml) ----------------------------------------
REGNET = SPACES / "regnet_cnn.yaml"


def _regnet_as_arch(depths, widths, group_width, se, head):
    """A zoo RegNet's body written in the space format (bottleneck 1, ReLU, 224 input)."""
    blocks = [{"type": "xblock", "group_width": group_width, "bottleneck": 1, "se": se,
               "stride": 2 if i == 0 else 1, "channels": w, "residual": False}
              for d, w in zip(depths, widths) for i in range(d)]
    return {"format": 1, "space": "regnet_cnn", "seed": 0, "index": 0, "input": [224, 224, 3],
            "activation": "RELU", "stem": {"kernel": 3, "stride": 2, "channels": 32},
            "blocks": blocks, "head": {"channels": head, "classes": 1000, "softmax": True}}


@pytest.mark.parametrize("variant, depths, widths, group_width, se", [
    ("x_400mf", (1, 2, 7, 12), (32, 64, 160, 400), 16, False),
    ("y_400mf", (1, 3, 6, 6), (48, 104, 208, 440), 8, True)])
def test_xblocks_rebuild_the_zoos_regnets(variant, depths, widths, group_width, se):
    # The zoo's RegNets are checked against the published parameter counts (tests/test_zoo.py);
    # the same stage table through the space's xblock gives the same body. The sampler's head
    # adds a 1x1 conv to `head` channels before the classifier that RegNet does not have.
    from latpred.zoo import build as build_zoo
    from latpred.zoo import param_count

    head, last = 640, widths[-1]
    ours = build_graph(_regnet_as_arch(depths, widths, group_width, se, head))
    zoo = build_zoo(f"regnet_{variant}")
    assert param_count(ours) == param_count(zoo) - (last * 1000 + 1000) \
        + (last * head + head) + (head * 1000 + 1000)

    def grouped(g):
        return [(op.attr("groups"), g.tensors[op.inputs[0]].shape) for op in g.ops
                if op.type == "CONV_2D" and op.attr("groups", 1) > 1]
    assert grouped(ours) == grouped(zoo) and len(grouped(ours)) == sum(depths)


def test_regnet_space_draws_many_groups_of_compatible_widths():
    archs = sample(REGNET, 40, 3)
    groups = []
    for arch in archs:
        assert [layer["stride"] for layer in arch["blocks"]].count(2) == 4
        for layer in arch["blocks"]:
            width = layer["channels"] // layer["bottleneck"]
            assert layer["channels"] % layer["bottleneck"] == 0
            assert width % layer["group_width"] == 0
            groups.append(width // layer["group_width"])
        # each block has its own shortcut: a projection where the shape changes
        g = build_graph(arch)
        assert sum(op.type == "ADD" for op in g.ops) == len(arch["blocks"])
    groups.sort()
    assert groups[len(groups) // 2] >= 6 and groups[-1] >= 30   # RegNets run 14-55 groups
    assert sample(REGNET, 5, 3) == archs[:5]


def test_regnet_space_models_run_on_litert():
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    import numpy as np

    from latpred.tflite import write_tflite

    arch = sample_one(load_space(REGNET), 0, 1)
    graph = build_graph(arch)
    interpreter = litert.Interpreter(model_content=write_tflite(graph), num_threads=1)
    interpreter.allocate_tensors()
    size = arch["input"][0]
    image = np.random.default_rng(0).standard_normal((1, size, size, 3), dtype=np.float32)
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], image)
    interpreter.invoke()
    out = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    assert out.shape == (1, 1000) and np.isclose(out.sum(), 1.0, atol=1e-3)


SMALL = SPACES / "converter_small.yaml"


def test_small_space_draws_both_heads_and_keeps_keras_head_widths():
    archs = sample(SMALL, 40, 2)
    styles = Counter(a["head"].get("style", "fc") for a in archs)
    assert styles["fc"] and styles["pooled_conv"]
    for arch in archs:
        assert arch["width"] <= 1.0 and arch["input"][0] in (96, 128, 160)
        # keras.applications keeps the head's channels at widths up to 1
        assert 480 <= arch["head"]["channels"] <= 1280
        g = build_graph(arch)
        tail = [op.type for op in g.ops[-6:]]
        if arch["head"].get("style") == "pooled_conv":
            # MobileNetV3's head as the converter writes it: 1x1 convs on the pooled 1x1 map
            assert tail == ["CONV_2D", "MEAN", "CONV_2D", "CONV_2D", "RESHAPE", "SOFTMAX"]
            point = g.ops[-4]
            assert g.tensors[point.outputs[0]].shape == (1, 1, 1, arch["head"]["point"])
        else:
            assert tail[-3:] == ["MEAN", "FULLY_CONNECTED", "SOFTMAX"]


def test_a_pooled_conv_head_needs_point_channels():
    data = raw(SMALL)
    del data["head"]["point"]
    with pytest.raises(ConfigError, match="point"):
        parse_space(data)
