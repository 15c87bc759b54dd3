"""Machines as graphs: devices, switches, links, and what a transfer between two devices costs.

- :mod:`~planner.topology.graph`: :class:`Topology` and :class:`Device` (routes on demand);
- :mod:`~planner.topology.routing`: widest-bottleneck, fewest-hop routes;
- :mod:`~planner.topology.routes`: routes worked out on first use, in bounded caches;
- :mod:`~planner.topology.collectives`: the ring all-reduce;
- :mod:`~planner.topology.load`: the ``pipeplan.topology/v1`` YAML format;
- :mod:`~planner.topology.detect`: a topology from ``nvidia-smi topo -m``;
- :mod:`~planner.topology.svg`: a drawing of the graph.

Example::

    topo = load_topology("topologies/dgx1-v100.yaml")
    topo.transfer_ms("gpu0", "gpu7", 64 * 2**20)   # 64 MiB over the widest route
    topo.route("gpu0", "gpu7")                     # ['gpu0', 'gpu4', 'gpu7']
    topo.allreduce_ms(["gpu0", "gpu1", "gpu2", "gpu3"], 2**30)
"""

from planner.topology.graph import SCHEMA, Device, Topology
from planner.topology.load import (
    as_topology,
    expand_names,
    load_topology,
    topology_from_dict,
    uniform_topology,
)

__all__ = [
    "SCHEMA",
    "Device",
    "Topology",
    "as_topology",
    "expand_names",
    "load_topology",
    "topology_from_dict",
    "uniform_topology",
]
