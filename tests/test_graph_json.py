"""A Graph survives JSON (what a dataset row keeps of a converter's file) unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from latpred.graph_json import graph_from_json, graph_to_json
from latpred.profile.prepare import with_graph
from latpred.sampler import build_graph, sample
from latpred.tflite import read_tflite

FIXTURES = Path(__file__).parent / "fixtures"
FILES = sorted(FIXTURES.glob("*.tflite")) + sorted((FIXTURES / "corpus").glob("*.tflite"))


@pytest.mark.parametrize("path", [p for p in FILES if "dynamic_hw" not in p.name],
                         ids=lambda p: p.stem)
def test_round_trip_of_real_files(path):
    graph = read_tflite(path)
    assert graph_from_json(json.loads(json.dumps(graph_to_json(graph)))) == graph


def test_dataset_rows_of_files_rebuild_through_the_sampler():
    graph = read_tflite(FIXTURES / "corpus" / "fx_efficientnet_tiny_96.tflite")
    facts = json.dumps({"name": "fx", "space": "converter"})
    arch = json.loads(with_graph(facts, graph))
    assert arch["name"] == "fx" and build_graph(arch) == graph
    sampled = json.dumps(sample("search_space/synthetic_cnn.yaml", 1, 0)[0])
    assert with_graph(sampled, graph) == sampled     # a sampler description stays as it is
    assert json.loads(with_graph("", graph))["graph"]["ops"]


def test_malformed_graph_is_a_config_error():
    from latpred.errors import ConfigError

    with pytest.raises(ConfigError, match="graph"):
        build_graph({"graph": {"format": 1, "tensors": [["x"]], "ops": []}})
