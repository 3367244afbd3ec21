"""Training on a Ray cluster (`predictors.cluster`): a two-node cluster on this machine fits a
predictor equal to one fitted here, and neither a training nor a farm campaign runs beside the
other. Skipped when Ray (the optional extra `latpred[ray]`) is not installed."""

from __future__ import annotations

import socket
import time

import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from latpred.errors import LatpredError, MeasurementError  # noqa: E402
from latpred.predictors.cluster import on_ray  # noqa: E402
from latpred.predictors.model import LatencyModel  # noqa: E402
from latpred.predictors.search import SearchSpec, fit_searched  # noqa: E402
from latpred.predictors.training import out_of_fold_kernels  # noqa: E402
from latpred.sampler import build_graph, sample  # noqa: E402

from simdata import SPACE, simulate  # noqa: E402

TARGET = "host/cpu/fp32/t1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_train_on_an_address_where_nothing_listens_is_one_sentence(tmp_path):
    # first in the module: no connection is open yet, so the address is tried
    from click.testing import CliRunner

    from latpred.cli import main

    ds = simulate(tmp_path / "d", n_models=6)
    port = _free_port()
    res = CliRunner().invoke(main, ["train", "--data", str(ds.root), "--target", TARGET,
                                    "--search", "none", "--ray", f"127.0.0.1:{port}",
                                    "--out", str(tmp_path / "p")])
    assert res.exit_code == 2, res.output
    assert f"Nothing answers at 127.0.0.1:{port}" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "p").exists()


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine, one CPU each; the head declares a farm device."""
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"latpred-cpu-0": 1}, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3}})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return simulate(tmp_path_factory.mktemp("sim") / "d", n_models=40, seed=3)


def test_a_predictor_trained_on_the_cluster_equals_one_trained_here(cluster, data):
    here = LatencyModel.fit(data, TARGET, family="gbdt", search="latpred")
    with on_ray(cluster.address):
        there = LatencyModel.fit(data, TARGET, family="gbdt", search="latpred")
    assert set(there.types) == set(here.types)
    for ktype, fit in here.types.items():
        # the search's choice, its cross-validated MAPE to the last bit, the training error
        assert there.types[ktype].metrics == fit.metrics, ktype
    graphs = [build_graph(a) for a in sample(SPACE, 20, seed=99)]
    assert ([p.total_ms for p in there.predict_many(graphs)]
            == [p.total_ms for p in here.predict_many(graphs)])


@pytest.mark.parametrize("method", ["grid", "random"])
@pytest.mark.parametrize("grouped", [False, True])
def test_a_search_on_the_cluster_picks_as_scikit_learn_does(cluster, method, grouped):
    rng = np.random.default_rng(5)
    X = pd.DataFrame(rng.random((120, 4)), columns=["flops", "bytes_read", "a", "b"])
    y = 0.1 + X["flops"].to_numpy() * 3 + rng.random(120) * 0.2
    groups = np.repeat(np.arange(24), 5) if grouped else None
    spec = SearchSpec("gbdt", "t", method, cv=5, n_iter=6, params={
        "n_estimators": (20, 50), "num_leaves": (3, 7), "learning_rate": (0.05, 0.2)})
    here = fit_searched(spec, X, y, seed=2, groups=groups)
    with on_ray(cluster.address):
        there = fit_searched(spec, X, y, seed=2, groups=groups)
    assert there.best_params == here.best_params
    assert there.cv_mape == here.cv_mape and there.n_candidates == here.n_candidates
    assert np.array_equal(there.estimator.predict(X), here.estimator.predict(X))


def test_the_residual_stages_refits_on_the_cluster_equal_the_ones_here(cluster, data):
    from latpred.predictors.search import load_search
    from latpred.predictors.training import load_tables

    kernels, _ = load_tables(data, TARGET)
    spec = load_search("gbdt", "latpred")
    model = LatencyModel.fit(data, TARGET, family="gbdt", search="none")
    here = out_of_fold_kernels(kernels, model.types, spec, seed=1)
    with on_ray(cluster.address):
        there = out_of_fold_kernels(kernels, model.types, spec, seed=1)
    assert np.array_equal(there, here)
    # the refits left each row's own model out: not the full fit's predictions
    full = np.empty(len(kernels))
    for ktype, rows in kernels.groupby("kernel_type"):
        X = rows[["f_" + f for f in model.types[ktype].features]].to_numpy(np.float64)
        full[kernels.index.get_indexer(rows.index)] = model.types[ktype].regressor.predict(X)
    assert not np.allclose(here, full)


def test_training_refuses_to_run_beside_a_timing_campaign(cluster):
    @ray.remote(num_cpus=0, resources={"latpred-cpu-0": 1})
    class Measuring:
        def ready(self) -> bool:
            return True

    device = Measuring.remote()
    ray.get(device.ready.remote())
    try:
        with pytest.raises(LatpredError, match=r"timing campaign is measuring on this Ray "
                                               r"cluster \(latpred-cpu-0 held\)"):
            with on_ray(cluster.address):
                pass
    finally:
        ray.kill(device)


def test_a_farm_campaign_refuses_to_start_beside_a_training(cluster):
    from latpred.profile.farm import _refuse_busy_cpus

    @ray.remote(num_cpus=1)
    def fit() -> None:
        time.sleep(8)

    running = fit.remote()
    deadline = time.time() + 5
    while ray.available_resources().get("CPU", 0) >= ray.cluster_resources()["CPU"]:
        assert time.time() < deadline, "the task never started"
        time.sleep(0.1)
    with pytest.raises(MeasurementError, match="1 of the Ray cluster's 2 CPUs are in use"):
        _refuse_busy_cpus(ray)
    ray.cancel(running, force=True)


def test_the_command_line_trains_on_the_cluster(cluster, tmp_path):
    from click.testing import CliRunner

    from latpred.cli import main

    small = simulate(tmp_path / "d", n_models=12)
    res = CliRunner().invoke(main, ["train", "--data", str(small.root), "--target", TARGET,
                                    "--ray", cluster.address, "--out", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert LatencyModel.load(tmp_path / "p").types


def test_a_fewshot_protocols_draws_on_the_cluster_equal_the_ones_here(cluster, tmp_path):
    from latpred.evaluate.fewshot import protocol_fewshot

    source = LatencyModel.fit(simulate(tmp_path / "src", n_models=30, seed=0), TARGET,
                              family="lasso", search="latpred")
    new = simulate(tmp_path / "new", TARGET, n_models=36, seed=1,
                   type_scale={"conv2d": 1.4, "dwconv2d": 0.7, "elementwise": 1.2})

    def run(progress):
        return protocol_fewshot(source, new, TARGET, shots=(10,), draws=2, n_test=12,
                                families=("lasso",), progress=progress)

    said_here, said_there = [], []
    here = run(said_here.append)
    with on_ray(cluster.address):
        there = run(said_there.append)
    pd.testing.assert_frame_equal(there.sizes, here.sizes)
    assert sorted(said_there) == sorted(said_here) == sorted(
        f"10 models, draw {d}/2 done" for d in (1, 2))


def test_a_node_killed_mid_training_costs_time_not_results(cluster, tmp_path):
    """Ray retries a fit whose node died on another node: `run_all` (every fit of a training
    on the cluster goes through it) still returns each job's own result, in order. Last in
    the module: the cluster is left with the head node alone."""
    import threading

    from latpred.predictors import cluster as training

    worker = next(iter(cluster.worker_nodes))
    marker = tmp_path / "a-fit-runs-on-the-worker"

    def fit(i: int, marker_path: str, worker_id: str) -> int:
        import pathlib

        if ray.get_runtime_context().get_node_id() == worker_id:
            pathlib.Path(marker_path).touch()
            time.sleep(600)             # never finishes there: its node is killed under it
        time.sleep(0.2)
        return i * i

    def kill_the_worker() -> None:
        deadline = time.time() + 120
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.05)
        cluster.remove_node(worker, allow_graceful=False)

    killer = threading.Thread(target=kill_the_worker)
    killer.start()
    with on_ray(cluster.address):
        got = training.run_all(fit, [(i, str(marker), worker.node_id) for i in range(6)])
    killer.join()
    assert marker.exists(), "no fit ever ran on the worker node"
    assert got == [i * i for i in range(6)]
