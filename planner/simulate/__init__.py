"""Event-driven simulation of one training iteration of a pipeline plan.

The simulator executes the schedule's per-device action lists exactly as ``run`` does:

* compute (F, B, I, W) takes the profiled time of the stage's layers divided by the
  device's speed; recompute adds a forward to the backward (and to I);
* a send is non-blocking: the transfer starts when the data is ready and every link of
  its route is free; a receive blocks the device until the data has arrived;
* links: each directed link carries one transfer at a time. A transfer holds all links of
  its route for ``latency + bytes / bottleneck bandwidth``; transfers that want a busy
  link wait. A link serves its transfers in a fixed order -- the order their data becomes
  ready in a reference run (profile times, speed-1 devices, free communication), close to
  first come first served for equally fast devices, and it keeps the time monotone in
  every speed and bandwidth (:mod:`planner.simulate.links`);
* ``ALLREDUCE s`` waits for every replica of stage ``s`` and then takes the topology's
  ring all-reduce time of the stage's gradients (links are not shared with pipeline
  transfers in this model); ``STEP s`` takes the stage's optimizer step: the profiled
  ``optimizer_ms`` of its layers divided by the device's speed (0 for profiles without
  it), unless an explicit ``step_ms`` replaces it;
* a tied parameter (``profile.tied_parameters``) is held, and counted in memory, by every
  stage that uses it; its gradient is exchanged by a ring all-reduce of its bytes among all
  devices of those stages, which each such device pays in its first STEP (of an iteration)
  of a stage that holds it. A replicated stage's ALLREDUCE leaves its tied parameters out;
* precision is the profile's: its times and bytes were measured under autocast. In fp16
  every device's STEPs come after its backward work, and its first STEP pays the
  all-reduce of one overflow flag among all devices (:func:`overflow_agreement_ms`).
* a tensor-parallel group (``gpu0+gpu1``) runs as its leader, every member the same:
  its shard's times (the profile's ``sharded`` entries) at its slowest member's speed,
  plus its layers' collectives on the group's ring; transfers between groups member to
  member, together; replica all-reduces on one ring per member, the slowest counting.
  ZeRO-1 reduce-scatters the gradients, steps on ``1 / r`` of the state and all-gathers
  the weights; FSDP gathers the weights at an iteration's first forward and holds them,
  whole, until its reduce-scatter (``shards``, ``group_comm``, ``grouped``; docs/parallelism.md).

Memory per device over time = weights + gradients + optimizer state of its stages (plus a
second weight version under 2bw) + the activations of the microbatches in flight, which
are stashed when a forward starts and freed when the backward (or W) ends; while a
forward, backward or half runs, the stage's workspace (``stage_workspace_bytes``), and
while a STEP runs the temporaries of its optimizer step (``stage_step_workspace_bytes``)
come on top. Both are measured on CUDA only; CPU profiles have none.

How it is computed (one concept per module):

* ``program``: the compiled per-device programs and the named codes of their actions;
* ``tables``: per-stage times, steps, tied exchange, fp16 overflow agreement and memory,
  laid out per device and slot; ``shards``: a tensor-parallel member's view of the
  profile and a sharded stage's memory; ``group_comm``: collectives and transfers of
  groups; ``grouped``: a grouped plan timed through its leaders;
* ``events``: the event engine, the definition; ``links``: the transfers' routes and
  each link's order (from a reference run);
* ``in_order``: the fixed-order pass that gives the event engine's numbers, bit for bit,
  over a topology without all-reduces (several times faster for long no-flush streams);
* ``shapes``: compiled programs per schedule shape, and the bounded cache of them;
* ``fold``: identical data-parallel replicas run once (replica 0, every other device its
  counterpart's numbers; solver runs without events), the same numbers bit for bit;
* ``totals``: peaks and busy times, which follow from program order alone;
* ``timing``: :func:`simulate_schedule` (tables, shape, engine, result; its ``engine=``
  option picks the engine); ``order_search``: :func:`optimized_schedule`, the search of
  warm-up depths and W deferral that simulates its candidates; ``iteration``:
  :func:`simulate`; ``result``: :class:`SimResult` and its events; ``bounds``:
  :func:`lower_bound_ms`. A plan from a simulation is
  :func:`planner.plan.plan_from_simulation`'s.

Example::

    result = simulate(profile, topology, stages, "1f1b", num_microbatches=8)
    result.iteration_ms, result.memory_bytes["gpu0"], result.bubble_fraction
"""

from __future__ import annotations

from planner.shape import PlanShape
from planner.simulate.bounds import lower_bound_ms
from planner.simulate.iteration import STREAM_ITERATIONS, simulate, simulate_shape
from planner.simulate.order_search import optimized_schedule
from planner.simulate.result import SimEvent, SimResult, TransferEvent
from planner.simulate.tables import overflow_agreement_ms, tied_exchange_ms
from planner.simulate.timing import ENGINES, Engine, simulate_schedule

__all__ = [
    "ENGINES",
    "STREAM_ITERATIONS",
    "Engine",
    "PlanShape",
    "SimEvent",
    "SimResult",
    "TransferEvent",
    "lower_bound_ms",
    "optimized_schedule",
    "overflow_agreement_ms",
    "simulate",
    "simulate_schedule",
    "simulate_shape",
    "tied_exchange_ms",
]
