"""Targets and device profiles: parsing, canonical strings, validation, caching."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from latpred.errors import ConfigError, LatpredError, TargetError
from latpred.device_profile import (DEVICES_DIR, available_devices, load_device, parse_cores,
                                    parse_profile)
from latpred.target import parse_target, target_strings

PAPER_PHONES = {"pixel4": "adreno", "mi8se": "adreno", "galaxys10": "mali",
                "galaxya03s": "powervr", "iphonexs": "apple", "iphone7": "apple"}


def test_shipped_profiles_cover_the_paper_host_and_h100():
    assert set(available_devices()) == set(PAPER_PHONES) | {"host", "h100"}
    for name, vendor in PAPER_PHONES.items():
        device = load_device(name)
        assert device.gpu.vendor == vendor
        assert device.runtime_version == "2.9" and device.gpu_rules == "tflite-2.9"


def test_h100_profile_figures():
    h100 = load_device("h100")
    g = h100.gpu
    assert (g.compute_units, g.wave_size, g.registers_per_cu, g.cache_line_bytes) == \
        (132, 32, 65536, 128)
    assert g.l2_bytes == 50 * 1024 * 1024
    assert h100.runtime == "litert" and h100.runtime_version == "2.3.0"
    assert h100.gpu_rules == "litert-2.3-mldrift"


def test_paper_table1_clusters():
    pixel4 = load_device("pixel4")
    assert [(c.name, c.count, c.freq_ghz) for c in pixel4.clusters] == \
        [("L", 1, 2.84), ("M", 3, 2.32), ("S", 4, 1.80)]
    assert load_device("iphone7").total_cores == 4
    assert load_device("host").core_mode == "threads"


@pytest.mark.parametrize("text, threads, cores", [
    ("pixel4/cpu/fp32/1L", 1, "1L"),
    ("pixel4/cpu/fp32/1L+3M", 4, "1L+3M"),
    ("pixel4/cpu/int8/3M+1L", 4, "1L+3M"),
    ("galaxys10/cpu/fp32/4S+2M+2L", 8, "2L+2M+4S"),
    ("host/cpu/int8/t2", 2, "t2"),
    ("host/cpu/fp32/t1", 1, "t1"),
    ("h100/cpu/fp32/t16", 16, "t16"),
])
def test_cpu_targets(text, threads, cores):
    t = parse_target(text)
    assert (t.processor, t.threads, t.cores) == ("cpu", threads, cores)
    assert str(t) == text.rsplit("/", 1)[0] + "/" + cores
    assert parse_target(str(t)) == t


def test_gpu_target_and_runtime():
    t = parse_target("h100/gpu/fp16")
    assert (t.processor, t.precision, t.runtime) == ("gpu", "fp16", "litert")
    assert str(t) == "h100/gpu/fp16" and t.is_gpu
    assert str(parse_target("pixel4/cpu/fp32")) == "pixel4/cpu/fp32/1L"  # the default core set


@pytest.mark.parametrize("text, words", [
    ("pixel5/gpu/fp16", ["pixel5", "pixel4", "h100", "host"]),
    ("pixel4/npu/fp16", ["npu", "cpu, gpu"]),
    ("host/gpu/fp16", ["has no processor", "cpu"]),
    ("pixel4/gpu/int8", ["int8", "fp16, fp32"]),
    ("pixel4/cpu/fp16/1L", ["fp16", "fp32, int8"]),
    ("pixel4/cpu/fp32/2L", ["2L", "1L, 3M, 4S"]),
    ("pixel4/cpu/fp32/1L+1L", ["1L+1L"]),
    ("pixel4/cpu/fp32/t2", ["t2", "1L, 3M, 4S"]),
    ("host/cpu/fp32/t3", ["t3", "t1 to t2"]),
    ("pixel4/gpu/fp16/1L", ["no core set"]),
    ("pixel4", ["device/processor/precision"]),
    ("pixel4//fp32", ["device/processor/precision"]),
])
def test_bad_targets_list_what_exists(text, words):
    with pytest.raises(TargetError) as err:
        parse_target(text)
    assert isinstance(err.value, LatpredError)
    for word in words:
        assert word in str(err.value)


def test_every_listed_target_round_trips():
    for name in available_devices():
        for text in target_strings(load_device(name)):
            assert str(parse_target(text)) == text


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(PAPER_PHONES)), st.data())
def test_core_sets_are_canonical(name, data):
    device = load_device(name)
    counts = {c.name: data.draw(st.integers(0, c.count), label=c.name) for c in device.clusters}
    terms = [f"{n}{letter}" for letter, n in counts.items() if n]
    if not terms:
        return
    shuffled = data.draw(st.permutations(terms))
    canonical, threads = parse_cores(device, "+".join(shuffled))
    assert canonical == "+".join(terms) and threads == sum(counts.values())
    t = parse_target(f"{name}/cpu/fp32/{'+'.join(shuffled)}")
    assert parse_target(str(t)) == t


def test_profiles_are_cached():
    assert load_device("pixel4") is load_device("pixel4")
    assert parse_target("pixel4/gpu/fp16").device is load_device("pixel4")


def _raw(name: str = "pixel4") -> dict:
    return yaml.safe_load((DEVICES_DIR / f"{name}.yaml").read_text())


@pytest.mark.parametrize("edit, words", [
    (lambda r: r.pop("soc"), ["missing key 'soc'"]),
    (lambda r: r.update(extra=1), ["unknown key(s) extra"]),
    (lambda r: r["gpu"].update(vendor="matrox"), ["vendor 'matrox'"]),
    (lambda r: r["gpu"].update(compute_units=-2), ["compute_units must be a positive"]),
    (lambda r: r["gpu"].update(wave_size="wide"), ["wave_size has the wrong type"]),
    (lambda r: r.update(gpu_rules="tflite-0.1"), ["unknown gpu_rules", "tflite-2.9"]),
    (lambda r: r["cpu"].update(rules="none"), ["unknown cpu.rules"]),
    (lambda r: r.pop("gpu"), ["gpu and gpu_rules"]),
    (lambda r: r["cpu"]["clusters"][0].update(name="big"), ["one capital letter"]),
    (lambda r: r["cpu"]["clusters"].append({"name": "L", "count": 1}), ["duplicate"]),
    (lambda r: r["cpu"].update(default_cores="9L"), ["9L"]),
    (lambda r: r["cpu"].update(precisions=["fp64"]), ["precisions"]),
    (lambda r: r.update(name="pixel5"), ["does not match"]),
])
def test_profile_validation(edit, words):
    raw = copy.deepcopy(_raw())
    edit(raw)
    with pytest.raises(LatpredError) as err:
        parse_profile(raw, source="pixel4.yaml", name="pixel4")
    for word in words:
        assert word in str(err.value)


def test_profile_files_in_another_directory(tmp_path):
    (tmp_path / "board.yaml").write_text("name: board\n: : not yaml [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_device("board", tmp_path)
    raw = _raw("host")
    raw["name"] = "mini"
    (tmp_path / "mini.yaml").write_text(yaml.safe_dump(raw))
    assert parse_target("mini/cpu/fp32/t2", tmp_path).threads == 2
    with pytest.raises(TargetError, match="board, mini"):
        load_device("nope", tmp_path)


def test_cli_targets_lists_every_device():
    import json

    from click.testing import CliRunner

    from latpred.cli import main

    result = CliRunner().invoke(main, ["targets", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["device"]: r for r in json.loads(result.output)}
    assert set(rows) == set(available_devices())
    assert "h100/gpu/fp16" in rows["h100"]["targets"]
    assert rows["pixel4"]["gpu_rules"] == "tflite-2.9"
