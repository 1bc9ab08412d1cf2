"""Resource-tracker adapters: where a reporter learns about changes to its hosts.

A reporter owns one :class:`~protocol.source.SourceMachine` per host it
serves; an adapter is the other side of that, the thing that knows the host
(nova-compute's ResourceTracker in a deployment, a simulated host here).  The
adapter pushes changes into a :class:`TrackerSink` that the reporter provides:

* ``change(source, ops)`` – partial updates of what the tracker owns (io_ops,
  metrics, service state, hypervisor facts);
* ``release(source, instance)`` – an instance left the host and gives back
  what its claim consumed.

What claims consume (``*_used``, ``num_instances``, the ``instances``
namespace) is written by the arbiter when it accepts a claim, never diffed
from the tracker's full state: a tracker that had not yet seen a just-accepted
instance would otherwise erase its consumption and open the door to
overcommit.

Life cycle: ``hosts()`` and ``document()`` are read once at reporter start
(each host's first document, published as the announcement snapshot); then
``start(sink)`` until ``stop()``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Protocol

from protocol.document import SET, Document, Op
from protocol.hostdoc import COMPUTE, METRICS, SERVICE


class TrackerSink(Protocol):
    def change(self, source: str, ops: list[Op]) -> None: ...

    def release(self, source: str, instance: str) -> bool: ...

    def instances(self, source: str) -> list[str]: ...


class ResourceTracker(Protocol):
    def hosts(self) -> list[str]: ...

    def document(self, source: str) -> Document: ...

    def start(self, sink: TrackerSink) -> None: ...

    def stop(self) -> None: ...


#: (vcpus, memory_mb, disk_gb, weight) of the simulated host mix
DEFAULT_HOST_MIX = ((32, 131072, 1000, 5), (64, 262144, 2000, 3), (16, 65536, 500, 2))


def simulated_document(source: str, index: int, rng: random.Random,
                       host_mix: tuple[tuple[int, int, int, int], ...] = DEFAULT_HOST_MIX,
                       ) -> Document:
    """A compute node's first document, capacities drawn from ``host_mix``."""
    vcpus, memory_mb, disk_gb, _ = rng.choices(host_mix, weights=[m[3] for m in host_mix])[0]
    host = f"compute-{index:05d}"
    return {
        COMPUTE: {
            "host": host, "nodename": host, "host_ip": f"10.{index >> 16 & 255}.{index >> 8 & 255}."
            f"{index & 255}",
            "vcpus": vcpus, "vcpus_used": 0, "memory_mb": memory_mb, "memory_mb_used": 0,
            "disk_gb": disk_gb, "disk_gb_used": 0, "cpu_allocation_ratio": 4.0,
            "ram_allocation_ratio": 1.0, "disk_allocation_ratio": 1.0,
            "reserved_memory_mb": 512, "num_io_ops": 0, "num_instances": 0,
            "hypervisor_type": "QEMU", "hypervisor_version": 8002000,
            "supported_instances": [["x86_64", "kvm", "hvm"]],
        },
        SERVICE: {"disabled": False, "forced_down": False},
        METRICS: {"cpu.percent": 0},
    }


class SimulatedTracker:
    """``n`` simulated hosts that drift: io_ops and cpu load change, instances are deleted.

    Each host changes on average once per ``change_interval`` seconds (so the
    reporter publishes ``n / change_interval`` changes per second); a change
    deletes one of the host's instances with probability ``delete_probability``,
    otherwise it moves ``num_io_ops`` and ``metrics.cpu.percent``.
    """

    def __init__(self, n: int, *, seed: int = 0, prefix: str = "sim",
                 change_interval: float = 1.0, delete_probability: float = 0.05,
                 clock: Callable[[], float] = time.monotonic,
                 documents: dict[str, Document] | None = None) -> None:
        self._rng = random.Random(seed)
        if documents is not None:
            # hosts drawn elsewhere (the simulator's topology): drift only
            self._ids = list(documents)
            self._docs = documents
        else:
            self._ids = [f"{prefix}-{seed}-{i:05d}" for i in range(n)]
            self._docs = {s: simulated_document(s, i, self._rng) for i, s in enumerate(self._ids)}
        self.change_interval = change_interval
        self.delete_probability = delete_probability
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.changes = 0

    def hosts(self) -> list[str]:
        return list(self._ids)

    def document(self, source: str) -> Document:
        return self._docs[source]

    def step(self, sink: TrackerSink, source: str) -> None:
        """One random change of one host (public so a simulator can drive it)."""
        rng = self._rng
        self.changes += 1
        if rng.random() < self.delete_probability:
            instances = sink.instances(source)
            if instances:
                sink.release(source, rng.choice(sorted(instances)))
                return
        sink.change(source, [
            [SET, COMPUTE, "num_io_ops", rng.randrange(0, 8)],
            [SET, METRICS, "cpu.percent", rng.randrange(0, 100)],
        ])

    def start(self, sink: TrackerSink) -> None:
        if self.change_interval <= 0 or not self._ids:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(sink,), name="sim-tracker",
                                        daemon=True)
        self._thread.start()

    def _run(self, sink: TrackerSink) -> None:
        rate = len(self._ids) / self.change_interval
        start = self._clock()
        done = 0
        while not self._stop.is_set():
            due = int((self._clock() - start) * rate) - done
            for _ in range(due):
                # a backlog (changes slower than the rate asks) must not outlive stop()
                if self._stop.is_set():
                    return
                self.step(sink, self._rng.choice(self._ids))
                done += 1
            self._stop.wait(0.005)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
