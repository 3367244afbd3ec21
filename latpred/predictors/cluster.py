"""Training on a Ray cluster: a training's fits spread over the cluster's CPUs.

    with on_ray("auto"):                    # or "local", or HEAD_IP:6379
        model = LatencyModel.fit(data, target)

`on_ray(address)` (behind `latpred train --ray` and `latpred evaluate --ray`) joins a cluster
for the block it wraps. Inside it, `run_all` runs its jobs as Ray tasks, one CPU each: every
(candidate, fold) fit of a hyperparameter search (`search.fit_searched`) and every (kernel type,
fold) refit of the end-to-end residual stage (`training.out_of_fold_kernels`); outside it they
run here, one after another. The tasks fit what a run here fits, with the same seeds, and the
search keeps its best candidate by scikit-learn's own rule, so a predictor trained on a cluster
equals one trained here (tests/test_train_ray.py). Ray retries a task whose worker or node
died, so a lost node costs time, not the training.

Why tasks and not joblib's Ray backend (`ray.util.joblib`): that backend starts a pool of new
actor processes for every search, which import latpred and LightGBM afresh (~2 s a search
here: a 0.4 s search took 2.0-2.5 s); tasks reuse Ray's warm worker processes.

A timing campaign runs alone: `on_ray` refuses a cluster whose profiling-farm devices are held
(`ray_cluster.held_devices`: `latpred profile --ray` is measuring there), since fits running
beside it would slow its devices' runs and spoil its labels. Nodes run latpred's tasks, so
each needs latpred installed (as the farm's nodes do).
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from latpred.errors import LatpredError

_ray: Any = None            # Ray, while `on_ray` is active in this process
_task: Any = None           # `_call` as a Ray remote function of that session
_PLAIN = (int, float, str, bool, type(None))   # sent with each task as they are
_one_thread = False         # a worker's BLAS/OpenMP pools are limited to one thread


@contextmanager
def on_ray(address: str) -> Iterator[None]:
    """Fits inside the block run on the Ray cluster at `address` ("local" starts one here,
    "auto" finds a running one); a connection made here is closed at the end."""
    from latpred.ray_cluster import connect, held_devices

    global _ray, _task
    ray, joined = connect(address)
    outer = _ray, _task        # an enclosing `on_ray` (the same connection) goes on after
    try:
        busy = held_devices(ray)
        if busy:
            raise LatpredError("A timing campaign is measuring on this Ray cluster "
                               f"({', '.join(busy)} held); fits beside it would spoil its "
                               "labels: train when it has finished.")
        # a job whose worker or node died runs again elsewhere (tests/test_train_ray.py)
        _ray, _task = ray, ray.remote(num_cpus=1, max_retries=3)(_call)
        yield
    finally:
        _ray, _task = outer
        if joined:
            ray.shutdown()


def active() -> bool:
    """Whether fits run on a cluster now (inside `on_ray`)."""
    return _ray is not None


def run_all(fn: Callable[..., Any], jobs: Sequence[tuple],
            done: Callable[[int], None] | None = None) -> list[Any]:
    """[fn(*job) for job in jobs], as Ray tasks inside `on_ray`; `done(i)` is called as job i
    finishes. An object that several jobs share (a search's X, a few-shot protocol's test set)
    is put in the object store once, not sent with each task."""
    if _ray is None:
        out = []
        for i, job in enumerate(jobs):
            out.append(fn(*job))
            if done:
                done(i)
        return out
    shared = Counter(id(a) for job in jobs for a in job if not isinstance(a, _PLAIN))
    stored: dict[int, Any] = {}

    def ref(arg: Any) -> Any:
        if isinstance(arg, _PLAIN) or shared[id(arg)] < 2:
            return arg
        if id(arg) not in stored:
            stored[id(arg)] = _ray.put(arg)
        return stored[id(arg)]

    refs = [_task.remote(fn, *map(ref, job)) for job in jobs]
    if done:
        index = {r: i for i, r in enumerate(refs)}
        waiting = list(refs)
        while waiting:
            finished, waiting = _ray.wait(waiting, num_returns=1)
            done(index[finished[0]])
    return _ray.get(refs)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """A job on a worker (Ray passes the stored arguments as values)."""
    global _one_thread
    if not _one_thread:
        from threadpoolctl import threadpool_limits

        # one thread a fit, as training here (training.fit_all_types): the task holds one CPU.
        # Set once for the worker's life (a `with` per task cost ~4 ms, a small fit's time).
        threadpool_limits(limits=1)
        _one_thread = True
    return fn(*args)
