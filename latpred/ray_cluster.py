"""Joining a Ray cluster, for the profiling farm (`profile.farm`) and for training on the
cluster's CPUs (`predictors.cluster`).

A node declares each device it measures with as a Ray custom resource (`profile.farm_device`:
`latpred-cpu-<cores>`, `latpred-adb-<serial>`); a farm's actor holds its device's resource
while the campaign runs, which is how `held_devices` tells that one is measuring.
"""

from __future__ import annotations

from typing import Any, Mapping

from latpred.errors import LatpredError


def ray_module():
    """Ray, or one sentence saying how to install it."""
    try:
        import ray
    except ImportError:
        raise LatpredError("Running on a Ray cluster needs Ray: "
                           "pip install 'latpred[ray]'.") from None
    return ray


def connect(address: str, local_resources: Mapping[str, float] | None = None
            ) -> tuple[Any, bool]:
    """Join the cluster at `address` ("local": start one here, with `local_resources`, e.g. the
    farm's one device per core); returns Ray and whether this call connected (an existing
    connection is used as it is)."""
    ray = ray_module()
    if ray.is_initialized():
        return ray, False
    try:
        if address == "local":
            ray.init(resources=dict(local_resources or {}), include_dashboard=False,
                     log_to_driver=False)
        else:
            check_reachable(address)
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise LatpredError(f"Cannot join the Ray cluster at {address!r}: {first}") from None
    return ray, True


def check_reachable(address: str) -> None:
    """Fail fast on a HOST:PORT where nothing listens (ray.init would retry for minutes)."""
    import socket

    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        raise LatpredError(f"Nothing answers at {address}: start the cluster's head there "
                           "(`ray start --head`) or give its address.") from None


def held_devices(ray) -> list[str]:
    """The farm devices (resources) of the cluster that something holds now: a timing
    campaign measuring there."""
    from latpred.profile.farm_device import parse_device

    total, free = ray.cluster_resources(), ray.available_resources()
    return sorted(name for name, amount in total.items()
                  if parse_device(name, "") is not None and free.get(name, 0.0) < amount)

