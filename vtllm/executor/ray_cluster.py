"""Ray, the optional extra (`pip install 'vtllm[ray]'`) behind --distributed-executor-backend
ray and Ray-placed data-parallel replicas: imported only when asked for, one connection per
process, and placement groups of one bundle per worker.

ray.init() finds a running cluster through RAY_ADDRESS (`ray start --head` on one node,
`ray start --address=HEAD:6379` on the others) and otherwise starts a local one; a process that
already called ray.init (a test, an application embedding vtllm) keeps its own connection.
"""

import logging

from vtllm.errors import InvalidParameter

log = logging.getLogger("vtllm.engine")

PLACEMENT_TIMEOUT_S = 120.0  # a cluster short of the bundles' resources never places them


def import_ray(param: str = "distributed_executor_backend"):
    """The ray module, or a one-line user error naming the extra."""
    try:
        import ray
    except ImportError:
        raise InvalidParameter(
            "the ray backend needs Ray: pip install 'vtllm[ray]'", param=param
        ) from None
    return ray


def connect(param: str = "distributed_executor_backend"):
    """(ray, whether this call started the connection: its owner shuts it down)."""
    ray = import_ray(param)
    if ray.is_initialized():
        return ray, False
    ray.init(logging_level=logging.WARNING, log_to_driver=True)
    log.info("ray: connected to %s", ray.get_runtime_context().gcs_address)
    return ray, True


def node_id(ray) -> str:
    return ray.get_runtime_context().get_node_id()


def place(ray, bundles: list[dict], what: str):
    """A placement group of `bundles` (PACK: as few nodes as the resources allow, so that
    tensor-parallel ranks share a node where they fit), ready; a user error when the cluster
    cannot hold it."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        total = {k: sum(b.get(k, 0) for b in bundles) for k in bundles[0]}
        raise InvalidParameter(
            f"the ray cluster could not place {what} ({total}) in {PLACEMENT_TIMEOUT_S:g}s: "
            f"it has {ray.available_resources()}",
            param="distributed_executor_backend",
        )
    return group


def in_bundle(group, index: int) -> dict:
    """Actor options that pin an actor to one bundle of a placement group."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=index
    )
    return {"scheduling_strategy": strategy}


def remove(ray, group) -> None:
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(group)
    except Exception as exc:  # the cluster is already gone: nothing left to free
        log.debug("placement group not removed: %s", exc)
