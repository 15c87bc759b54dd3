"""Point-to-point bandwidth and latency between local CPU processes over gloo (torch.distributed).

The figures behind topologies/cpu.yaml: two processes on this machine exchange tensors with
``dist.send``/``dist.recv`` (what ``pipeplan run --device cpu`` uses between stages); a
ping-pong of 4-byte messages gives the latency, one-way streams of 1-64 MiB the bandwidth,
and both processes computing while they exchange 64 KiB-1 MiB messages what a message costs
each end's compute (``message_overhead``; :func:`_message_overhead`).

Run::

    .venv/bin/python bench/gloo_bandwidth.py            # table + bench/results/gloo_bandwidth.json
    .venv/bin/python bench/gloo_bandwidth.py --quick    # 1 and 4 MiB only
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
if "--quick" in sys.argv:  # 1 and 4 MiB only; spawned workers see the same argv
    SIZES = SIZES[:2]
REPEATS = 10
OVERHEAD_SIZES = [64 << 10, 256 << 10, 1 << 20]
CHUNKS, OVERHEAD_ROUNDS = 100, 5
if "--quick" in sys.argv:
    OVERHEAD_SIZES, OVERHEAD_ROUNDS = OVERHEAD_SIZES[1:2], 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ring_model_ms(nbytes: int) -> float:
    """The simulator's ring all-reduce of ``nbytes`` between cpu0 and cpu1 of
    topologies/cpu.yaml at full efficiency (its ``allreduce_efficiency`` is this ratio)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from planner.topology import Topology, load_topology

    topo = load_topology(Path(__file__).resolve().parents[1] / "topologies" / "cpu.yaml")
    full = Topology(topo.name, topo.graph, topo.devices, source=topo.source, relay=topo.relay)
    return full.allreduce_ms(["cpu0", "cpu1"], nbytes)


def _chunk(a: torch.Tensor, n: int) -> None:
    for _ in range(n):
        torch.mm(a, a)


def _message_overhead(rank: int, peer: int, size: int) -> dict[str, float]:
    """What one message costs each end's compute on a host whose cores are all busy (both
    processes compute on one thread each, as ``run`` on the 2-core VM): ``CHUNKS`` compute
    chunks of about 1 ms alone, then again with, after each chunk, one message of ``size``
    bytes sent to the peer (``isend``) and the peer's previous one waited for (its
    ``irecv`` posted a chunk ahead, so the data has arrived: no waiting on the wire, as in
    a pipeline's steady state). The extra time per chunk over the two message ends (one
    send, one receive) is the per-end overhead, ``message_overhead`` of topologies/cpu.yaml.
    """
    a = torch.randn(128, 128)
    tries = []
    for _ in range(5):  # chunks of about 1 ms: the fastest of five tries of 100 products
        t0 = time.perf_counter()
        _chunk(a, 100)
        tries.append((time.perf_counter() - t0) / 100)
    agreed = torch.tensor([max(1, round(1e-3 / min(tries)))])
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # the same chunk on both ranks
    n = int(agreed)
    out = torch.ones(size // 4)
    plain, messages = [], []
    for _ in range(OVERHEAD_ROUNDS):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(CHUNKS):
            _chunk(a, n)
        plain.append(time.perf_counter() - t0)
        bufs = [torch.empty(size // 4) for _ in range(CHUNKS)]
        dist.barrier()
        t0 = time.perf_counter()
        recvs = [dist.irecv(b, peer) for b in bufs]  # all ahead, as run does on the CPU
        sends = []
        for k in range(CHUNKS):
            _chunk(a, n)
            sends.append(dist.isend(out, peer))
            if k > 0:
                recvs[k - 1].wait()
        recvs[-1].wait()
        for w in sends:
            w.wait()
        messages.append(time.perf_counter() - t0)
    base, with_messages = statistics.median(plain), statistics.median(messages)
    return {
        "bytes": size,
        "chunk_ms": base / CHUNKS * 1e3,
        "overhead_us": max(0.0, with_messages - base) / (2 * CHUNKS) * 1e6,
    }


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from planner.allocator import keep_freed_memory

    keep_freed_memory()  # as run's workers: the flattening would otherwise fault every time
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    peer = 1 - rank
    results: dict[str, object] = {}
    small = torch.zeros(1, dtype=torch.float32)
    lat = []
    for _ in range(200):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(small, peer)
            dist.recv(small, peer)
        else:
            dist.recv(small, peer)
            dist.send(small, peer)
        lat.append((time.perf_counter() - t0) / 2)
    results["latency_us"] = statistics.median(lat[20:]) * 1e6
    rows = []
    for size in SIZES:
        buf = torch.ones(size // 4, dtype=torch.float32)
        times = []
        for _ in range(REPEATS + 2):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(small, peer)  # acknowledgement: the receiver has everything
            else:
                dist.recv(buf, peer)
                dist.send(small, peer)
            times.append(time.perf_counter() - t0)
        best = statistics.median(times[2:])
        # The all-reduce as the runtime's ALLREDUCE runs it: flatten the gradients (here 4
        # parts), all-reduce, copy back.
        parts = [torch.ones(size // 16, dtype=torch.float32) for _ in range(4)]
        reduce_times = []
        for _ in range(REPEATS + 2):
            dist.barrier()
            t0 = time.perf_counter()
            flat = torch.cat(parts)
            dist.all_reduce(flat)
            offset = 0
            for part in parts:
                part.copy_(flat[offset : offset + part.numel()])
                offset += part.numel()
            reduce_times.append(time.perf_counter() - t0)
        reduce = statistics.median(reduce_times[2:])
        rows.append(
            {
                "bytes": size,
                "seconds": best,
                "gb_per_s": size / best / 1e9,
                "allreduce_seconds": reduce,
                "allreduce_efficiency": _ring_model_ms(size) / (reduce * 1e3),
            }
        )
    results["rows"] = rows
    results["message_overhead"] = [_message_overhead(rank, peer, size) for size in OVERHEAD_SIZES]
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    out = Path("bench/results/gloo_bandwidth.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    mp.spawn(_worker, args=(_free_port(), str(tmp)), nprocs=2, join=True)
    data = json.loads(tmp.read_text())
    tmp.unlink()
    data["machine"] = f"{os.cpu_count()} CPU cores, torch {torch.__version__}, {sys.platform}"
    print(f"gloo send/recv between 2 local processes ({data['machine']})")
    print(f"latency (half round trip, 4 B): {data['latency_us']:.1f} us")
    print(f"{'size':>10} {'ms':>9} {'GB/s':>7} {'all-reduce ms':>14} {'efficiency':>11}")
    for row in data["rows"]:
        print(
            f"{row['bytes'] / 2**20:>7.0f} MiB {row['seconds'] * 1e3:>9.2f} {row['gb_per_s']:>7.2f}"
            f" {row['allreduce_seconds'] * 1e3:>14.2f} {row['allreduce_efficiency']:>11.2f}"
        )
    print("message overhead per end (both processes computing on one thread each):")
    for row in data["message_overhead"]:
        print(
            f"{row['bytes'] / 2**10:>7.0f} KiB {row['overhead_us']:>9.1f} us "
            f"(chunks of {row['chunk_ms']:.2f} ms)"
        )
    out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
