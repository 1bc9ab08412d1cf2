"""Protocol benchmark: how fast a scheduler can follow the stream, and how small a delta is.

What it measures, on one core (every timed loop is single-threaded Python; ``--pin``
also binds the process to one CPU, which steadies the figures on an idle machine
but hurts them when another process is busy on that CPU):

* ``deltas_applied_per_s`` – the scheduler's hot path.  Many compute-node
  sources (:class:`protocol.source.SourceMachine`, realistic documents) produce
  typical changes – mostly a single-field change (``memory_mb_used`` drifting),
  sometimes an instance boot (a claim accepted by the arbiter: a few compute
  fields and one ``instances`` entry) or an instance deletion – published as
  :class:`~protocol.messages.Batch` messages of ``--batch`` deltas.  The timed
  loop is ``Decoder.decode(bytes)`` + ``ReceiverMachine.receive(msg)`` over all
  batches, by a receiver that already holds every source's snapshot.  After the
  loop every view is checked against its source (same version, same digest),
  outside the timing.
* ``delta_bytes_mean`` vs ``snapshot_bytes_mean`` – the encoded size of a
  typical single-field delta sent alone (unbatched, unsigned) and of the full
  snapshot of the same host, each averaged per host and then over hosts.
* ``digest_us`` – microseconds per :func:`protocol.document.digest` of a
  typical host document.
* ``encode_deltas_per_s`` – deltas per second through ``encode(Batch)``;
  ``decode_deltas_per_s`` – decode alone, for comparison with the full path.

The workload is generated once (seeded); each of ``--runs`` runs replays it
through a fresh receiver.  Medians are reported, with the per-run values.

Run it as ``shm bench protocol [--json FILE]`` or
``python -m simulator.bench_protocol``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from typing import Any

from protocol import codec
from protocol.document import SET, Document, digest
from protocol.messages import PROTOCOL_VERSION, Batch, Claim, ClaimResult, DataItem, Delta
from protocol.receiver import ReceiverMachine
from protocol.signing import Keyring
from protocol.source import SourceMachine, next_epoch

#: the issue's targets
TARGET_DELTAS_PER_S = 100_000
TARGET_DELTA_RATIO = 0.10

_CPU_FLAGS = [
    "aes", "avx", "avx2", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "bmi1",
    "bmi2", "cx16", "erms", "f16c", "fma", "fsgsbase", "invpcid", "lahf_lm", "lm", "mmx",
    "movbe", "pcid", "pclmulqdq", "pdpe1gb", "popcnt", "rdrand", "rdseed", "sse", "sse2",
    "sse4.1", "sse4.2", "ssse3", "vmx", "x2apic", "xsave", "xsaveopt",
]
_FLAVORS = [  # vcpus, memory_mb, disk_gb
    (1, 2048, 20), (2, 4096, 40), (4, 8192, 80), (8, 16384, 160), (16, 32768, 320),
]


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def make_document(rng: random.Random, index: int, instances: int) -> Document:
    """A compute node's document as a reporter would build it."""
    host = f"compute-{index:05d}"
    vcpus, memory_mb, disk_gb = rng.choice([(64, 515_072, 3_500), (96, 772_096, 7_000),
                                            (128, 1_031_168, 7_000)])
    inst: dict[str, Any] = {}
    used = [0, 0, 0]
    for _ in range(instances):
        flavor = rng.choice(_FLAVORS[:4])
        inst[_uuid(rng)] = {"claim": _uuid(rng),
                            "resources": {"vcpus": flavor[0], "memory_mb": flavor[1],
                                          "disk_gb": flavor[2]}}
        for i in range(3):
            used[i] += flavor[i]
    reserved_memory = 4096
    compute = {
        "uuid": _uuid(rng),
        "host": host,
        "nodename": f"{host}.example.org",
        "hypervisor_hostname": f"{host}.example.org",
        "hypervisor_type": "QEMU",
        "hypervisor_version": 8_002_000,
        "host_ip": f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}",
        "vcpus": vcpus,
        "vcpus_used": used[0],
        "memory_mb": memory_mb,
        "memory_mb_used": used[1] + reserved_memory,
        "reserved_memory_mb": reserved_memory,
        "disk_gb": disk_gb,
        "disk_gb_used": used[2],
        "reserved_disk_gb": 0,
        "cpu_allocation_ratio": 4.0,
        "ram_allocation_ratio": 1.0,
        "disk_allocation_ratio": 1.0,
        "num_instances": instances,
        "num_io_ops": rng.randrange(0, 8),
        "disk_available_least": disk_gb - used[2],
        "cpu_info": {
            "arch": "x86_64", "model": "Icelake-Server", "vendor": "Intel",
            "topology": {"sockets": 2, "cores": vcpus // 4, "threads": 2},
            "features": _CPU_FLAGS,
        },
        "supported_instances": [["x86_64", "kvm", "hvm"], ["i686", "kvm", "hvm"]],
    }
    return {
        "compute": compute,
        "service": {"disabled": False, "forced_down": False, "disabled_reason": None,
                    "version": 66},
        "instances": inst,
        "aggregates": {
            f"agg-{k}": {"name": name, "metadata": meta}
            for k, (name, meta) in enumerate([
                (f"az{index % 3}", {"availability_zone": f"az{index % 3}"}),
                (f"rack-{index // 40}", {}),
                ("ssd", {"ssd": "true", "filter_tenant_id": "7d0c8e6a"}),
            ])
        },
        "metrics": {
            "cpu.percent": round(rng.random(), 4),
            "cpu.frequency": 2_600,
            "cpu.iowait.percent": round(rng.random() / 50, 4),
            "cpu.user.percent": round(rng.random() / 2, 4),
            "cpu.kernel.percent": round(rng.random() / 10, 4),
        },
        "numa": {
            f"cell{c}": {"cpus": list(range(c * vcpus // 2, (c + 1) * vcpus // 2)),
                         "memory_mb": memory_mb // 2, "pinned_cpus": []}
            for c in range(2)
        },
    }


class Workload:
    """The sources, their initial snapshots and the encoded stream of batches."""

    def __init__(self, *, hosts: int, deltas: int, batch: int, instances: int, boot_fraction: float,
                 seed: int, keyring: Keyring | None) -> None:
        rng = random.Random(seed)
        self.hosts = hosts
        self.batch = batch
        encoder = codec.Encoder(keyring)
        self.sources: list[SourceMachine] = []
        self.snapshot_bytes: list[bytes] = []  # as the receiver gets them (signed with --sign)
        snapshot_sizes: list[int] = []  # unsigned, to compare with the unsigned delta sizes
        epoch = None
        for i in range(hosts):
            epoch = next_epoch(epoch, 1_700_000_000_000_000_000 + i)
            sm = SourceMachine(_uuid(rng), epoch, make_document(rng, i, instances))
            sm.poll(0.0)  # the announcement
            self.sources.append(sm)
            snap = sm.snapshot()
            self.snapshot_bytes.append(encoder.encode(snap))
            snapshot_sizes.append(len(codec.encode(snap)))

        self.items: list[DataItem] = []  # the deltas, as a Batch holds its items
        kinds = {"field": 0, "boot": 0, "delete": 0}
        single: list[list[int]] = [[] for _ in range(hosts)]  # sizes of single-field deltas
        single_signed: list[int] = []
        boot_sizes: list[int] = []
        signer = codec.Encoder(Keyring(master=b"bench-master"))
        now = 0.0
        for n in range(deltas):
            h = rng.randrange(hosts)
            sm = self.sources[h]
            now += 1e-4
            r = rng.random()
            compute = sm.document["compute"]
            if r < boot_fraction / 2:
                kind = "boot"
                flavor = rng.choice(_FLAVORS)
                claim = Claim(f"claim-{n}", "bench-scheduler", sm.source, sm.epoch, sm.seq,
                              {"vcpus": flavor[0], "memory_mb": flavor[1], "disk_gb": flavor[2]},
                              _uuid(rng))
                sends = sm.handle_claim(claim, now)
                answer = sends[-1].message
                assert type(answer) is ClaimResult  # handle_claim's last send answers the claim
                if not answer.accepted:  # the host is full: free one instead
                    kind = "delete"
                    sends = self._delete(sm, rng, now)
            elif r < boot_fraction:
                kind = "delete"
                sends = self._delete(sm, rng, now)
            else:
                kind = "field"
                step = rng.choice((-512, -256, -128, 128, 256, 512))
                value = min(max(compute["memory_mb_used"] + step, compute["reserved_memory_mb"]),
                            compute["memory_mb"])
                if value == compute["memory_mb_used"]:
                    value -= 128
                sm.change([[SET, "compute", "memory_mb_used", value]], now)
                sends = sm.flush()
            for s in sends:
                msg = s.message
                if type(msg) is not Delta:
                    continue
                self.items.append(msg)
                if kind == "field" and len(msg.ops) == 1:
                    single[h].append(len(codec.encode(msg)))
                    if len(single_signed) < 2000:
                        single_signed.append(len(signer.encode(msg)))
                elif kind == "boot" and len(boot_sizes) < 2000:
                    boot_sizes.append(len(codec.encode(msg)))
            kinds[kind] += 1
        self.kinds = kinds
        self.batches = [encoder.encode(Batch(self.items[i:i + batch]))
                        for i in range(0, len(self.items), batch)]
        self.stream_bytes = sum(map(len, self.batches))

        for h, sizes in enumerate(single):
            if not sizes:  # no single-field change drawn for this host: build the one it would send
                sm = self.sources[h]
                used = sm.document["compute"]["memory_mb_used"]
                sizes.append(len(codec.encode(Delta(sm.source, sm.epoch, sm.seq + 1,
                                                    [[SET, "compute", "memory_mb_used", used + 128]]))))
        per_host_delta = [statistics.fmean(s) for s in single]
        self.delta_bytes_mean = statistics.fmean(per_host_delta)
        self.snapshot_bytes_mean = statistics.fmean(snapshot_sizes)
        self.delta_bytes_signed_mean = statistics.fmean(single_signed) if single_signed else 0.0
        self.boot_delta_bytes_mean = statistics.fmean(boot_sizes) if boot_sizes else 0.0

    @staticmethod
    def _delete(sm: SourceMachine, rng: random.Random, now: float) -> list:
        instances = sm.document.get("instances")
        if not instances:
            sm.change([[SET, "metrics", "cpu.percent", rng.random()]], now)
        else:
            sm.release(rng.choice(sorted(instances)), now)
        return sm.flush()


def _fresh_receiver(work: Workload, decoder: codec.Decoder) -> ReceiverMachine:
    rec = ReceiverMachine("bench-scheduler")
    for data in work.snapshot_bytes:
        rec.receive(decoder.decode(data), 0.0)
    rec.drain_changed()
    return rec


def _timed_apply(work: Workload, decoder: codec.Decoder) -> tuple[float, float, ReceiverMachine]:
    """(wall seconds, CPU seconds of this process, the receiver) of decoding and applying."""
    rec = _fresh_receiver(work, decoder)
    decode = decoder.decode
    receive = rec.receive
    batches = work.batches
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    now = 1.0
    for data in batches:
        receive(decode(data), now)
        now += 1e-3
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return elapsed, cpu, rec


def _timed_decode(work: Workload, decoder: codec.Decoder) -> float:
    decode = decoder.decode
    gc.collect()
    t0 = time.perf_counter()
    for data in work.batches:
        decode(data)
    return time.perf_counter() - t0


def _timed_encode(work: Workload, encoder: codec.Encoder) -> float:
    items, size = work.items, work.batch
    groups = [Batch(items[i:i + size]) for i in range(0, len(items), size)]
    encode = encoder.encode
    gc.collect()
    t0 = time.perf_counter()
    for b in groups:
        encode(b)
    return time.perf_counter() - t0


def _timed_digest(docs: list[Document], min_time: float = 0.2) -> float:
    """Microseconds per digest, over the documents, repeated to at least ``min_time`` seconds."""
    count = 0
    t0 = time.perf_counter()
    while True:
        for doc in docs:
            digest(doc)
        count += len(docs)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return elapsed / count * 1e6


def _verify(work: Workload, rec: ReceiverMachine) -> int:
    """Sources whose view differs from the source (0 when the run is valid)."""
    bad = 0
    for sm in work.sources:
        view = rec.view(sm.source)
        if view is None or view.version != sm.version or view.digest() != sm.published_digest():
            bad += 1
    return bad


def _pin_one_cpu() -> tuple[int | None, set[int] | None]:
    """Pin this process to one CPU; returns (cpu, previous affinity), Nones if impossible."""
    try:
        previous = os.sched_getaffinity(0)
        cpu = sorted(previous)[0]
        os.sched_setaffinity(0, {cpu})
        return cpu, previous
    except (AttributeError, OSError):
        return None, None


def run(*, hosts: int = 2000, deltas: int = 200_000, batch: int = 100, instances: int = 20,
        boot_fraction: float = 0.2, runs: int = 5, seed: int = 1, sign: bool = False,
        pin: bool = False, progress: Any = None) -> dict[str, Any]:
    """Run the benchmark; returns the result dictionary (see the module docstring).

    ``pin``: run on one CPU (the affinity is restored afterwards).
    """
    cpu, previous = _pin_one_cpu() if pin else (None, None)
    try:
        return _run(hosts=hosts, deltas=deltas, batch=batch, instances=instances,
                    boot_fraction=boot_fraction, runs=runs, seed=seed, sign=sign, cpu=cpu,
                    progress=progress)
    finally:
        if previous is not None:
            os.sched_setaffinity(0, previous)


def _run(*, hosts: int, deltas: int, batch: int, instances: int, boot_fraction: float, runs: int,
         seed: int, sign: bool, cpu: int | None, progress: Any) -> dict[str, Any]:
    started = time.perf_counter()
    keyring = Keyring(master=b"bench-master") if sign else None
    say = progress or (lambda text: None)
    say(f"generating {deltas} deltas from {hosts} sources ...")
    work = Workload(hosts=hosts, deltas=deltas, batch=batch, instances=instances,
                    boot_fraction=boot_fraction, seed=seed, keyring=keyring)
    decoder = codec.Decoder(keyring)
    encoder = codec.Encoder(keyring)
    docs = [sm.document for sm in work.sources[:200]]
    n = len(work.items)
    per_run: list[dict[str, Any]] = []
    for i in range(runs):
        elapsed, apply_cpu, rec = _timed_apply(work, decoder)
        mismatched = _verify(work, rec)
        if rec.stats["applied"] != n or mismatched:
            raise RuntimeError(f"run {i}: applied {rec.stats['applied']} of {n}, "
                               f"{mismatched} views differ from their source")
        decode_s = _timed_decode(work, decoder)
        encode_s = _timed_encode(work, encoder)
        r = {
            "deltas_applied_per_s": n / elapsed,
            "apply_seconds": elapsed,
            # per second of this process's CPU: what a shared, busy machine disturbs least
            "deltas_applied_per_cpu_s": n / apply_cpu if apply_cpu > 0 else 0.0,
            "apply_cpu_seconds": apply_cpu,
            "decode_deltas_per_s": n / decode_s,
            "encode_deltas_per_s": n / encode_s,
            "digest_us": _timed_digest(docs),
        }
        per_run.append(r)
        say(f"run {i + 1}/{runs}: {r['deltas_applied_per_s']:,.0f} deltas applied/s")
    med = {k: statistics.median(r[k] for r in per_run) for k in per_run[0]}
    ratio = work.delta_bytes_mean / work.snapshot_bytes_mean
    return {
        "benchmark": "protocol",
        "protocol_version": PROTOCOL_VERSION,
        "deltas_applied_per_s": med["deltas_applied_per_s"],
        "deltas_applied_per_cpu_s": med["deltas_applied_per_cpu_s"],
        "decode_deltas_per_s": med["decode_deltas_per_s"],
        "encode_deltas_per_s": med["encode_deltas_per_s"],
        "digest_us": med["digest_us"],
        "delta_bytes_mean": work.delta_bytes_mean,
        "snapshot_bytes_mean": work.snapshot_bytes_mean,
        "delta_to_snapshot_ratio": ratio,
        "delta_bytes_signed_mean": work.delta_bytes_signed_mean,
        "boot_delta_bytes_mean": work.boot_delta_bytes_mean,
        "batch_bytes_mean": work.stream_bytes / len(work.batches),
        "targets": {
            "deltas_applied_per_s": TARGET_DELTAS_PER_S,
            "delta_to_snapshot_ratio": TARGET_DELTA_RATIO,
            "deltas_applied_per_s_met": med["deltas_applied_per_s"] >= TARGET_DELTAS_PER_S,
            "delta_to_snapshot_ratio_met": ratio <= TARGET_DELTA_RATIO,
        },
        "params": {
            "hosts": hosts, "deltas": n, "batch": batch, "batches": len(work.batches),
            "instances_per_host": instances, "boot_fraction": boot_fraction, "runs": runs,
            "seed": seed, "signed": sign, "cpu": cpu, "change_mix": work.kinds,
        },
        "runs": per_run,
        "environment": {
            "python": platform.python_version(), "implementation": platform.python_implementation(),
            "machine": platform.machine(), "msgpack": ".".join(map(str, __import__("msgpack").version)),
        },
        "wall_seconds": time.perf_counter() - started,
    }


def format_table(result: dict[str, Any]) -> str:
    """A readable summary: medians, targets and the per-run values."""
    p = result["params"]
    t = result["targets"]
    pinned = "" if p["cpu"] is None else f", pinned to cpu {p['cpu']}"
    lines = [
        f"protocol benchmark: {p['deltas']} deltas from {p['hosts']} sources, batches of "
        f"{p['batch']}, {p['runs']} run{'s' if p['runs'] != 1 else ''}{', signed' if p['signed'] else ''}"
        f"{pinned}",
        "",
        f"  {'metric':<30} {'median':>14}  target",
        f"  {'deltas applied/s (decode+apply)':<30} {result['deltas_applied_per_s']:>14,.0f}  "
        f">= {t['deltas_applied_per_s']:,} {'ok' if t['deltas_applied_per_s_met'] else 'MISSED'}",
        f"  {'  same, per CPU second':<30} {result['deltas_applied_per_cpu_s']:>14,.0f}",
        f"  {'deltas decoded/s (decode only)':<30} {result['decode_deltas_per_s']:>14,.0f}",
        f"  {'deltas encoded/s':<30} {result['encode_deltas_per_s']:>14,.0f}",
        f"  {'digest (us per document)':<30} {result['digest_us']:>14.1f}",
        f"  {'single-field delta (bytes)':<30} {result['delta_bytes_mean']:>14.1f}",
        f"  {'  same, signed (bytes)':<30} {result['delta_bytes_signed_mean']:>14.1f}",
        f"  {'instance-boot delta (bytes)':<30} {result['boot_delta_bytes_mean']:>14.1f}",
        f"  {'snapshot (bytes)':<30} {result['snapshot_bytes_mean']:>14.1f}",
        f"  {'delta / snapshot':<30} {result['delta_to_snapshot_ratio']:>14.2%}  "
        f"<= {t['delta_to_snapshot_ratio']:.0%} {'ok' if t['delta_to_snapshot_ratio_met'] else 'MISSED'}",
        "",
        f"  {'run':<5}{'applied/s':>14}{'decoded/s':>14}{'encoded/s':>14}{'digest us':>11}",
    ]
    for i, r in enumerate(result["runs"], 1):
        lines.append(f"  {i:<5}{r['deltas_applied_per_s']:>14,.0f}{r['decode_deltas_per_s']:>14,.0f}"
                     f"{r['encode_deltas_per_s']:>14,.0f}{r['digest_us']:>11.1f}")
    lines.append(f"\n  total wall time {result['wall_seconds']:.1f} s")
    return "\n".join(lines)


def build_parser(prog: str = "shm bench protocol") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Measure protocol decode+apply throughput, delta vs snapshot size and digest cost.")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--runs", type=int, default=5, help="timed runs; medians are reported (5)")
    parser.add_argument("--hosts", type=int, default=2000, help="number of sources (2000)")
    parser.add_argument("--deltas", type=int, default=200_000, help="deltas per run (200000)")
    parser.add_argument("--batch", type=int, default=100, help="deltas per Batch message (100)")
    parser.add_argument("--instances", type=int, default=20, help="instances per host (20)")
    parser.add_argument("--boot-fraction", type=float, default=0.2,
                        help="share of changes that boot or delete an instance (0.2)")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (1)")
    parser.add_argument("--sign", action="store_true", help="sign every item and verify on decode")
    parser.add_argument("--pin", action="store_true", help="bind the process to one CPU while it runs")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: list[str] | None = None, prog: str = "shm bench protocol") -> int:
    args = build_parser(prog).parse_args(argv)
    if min(args.runs, args.hosts, args.deltas, args.batch) < 1 or args.instances < 0 \
            or not 0.0 <= args.boot_fraction <= 1.0:
        print(f"{prog}: --runs, --hosts, --deltas and --batch must be positive, --instances "
              "non-negative and --boot-fraction within [0, 1]", file=sys.stderr)
        return 2
    progress = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    result = run(hosts=args.hosts, deltas=args.deltas, batch=args.batch, instances=args.instances,
                 boot_fraction=args.boot_fraction, runs=args.runs, seed=args.seed, sign=args.sign,
                 pin=args.pin, progress=progress)
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m simulator.bench_protocol"))
