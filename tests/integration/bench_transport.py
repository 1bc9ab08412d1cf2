"""Throughput of the transport classes (a measurement, not a test).

Run from the repository root with RabbitMQ at 127.0.0.1:5672:

    PYTHONPATH=. .venv/bin/python tests/integration/bench_transport.py [N]

Prints one JSON line per scenario: kombu stream publish with and without
publisher confirms, replay of the stream by a consumer from "first" and
from the middle, and the in-process bus in both modes.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid

from transport.inprocess import InProcessBus
from transport.kombu_stream import KombuStreamDataPlane, StreamSettings
from transport.stream_declare import delete_stream

URL = "amqp://guest:guest@127.0.0.1:5672//"
BODY = b"\x93" + b"x" * 299  # ~300 bytes, like a msgpack'd delta batch


def kombu_run(n: int, confirms: bool) -> None:
    name = f"shm-bench-{uuid.uuid4().hex[:8]}"
    settings = StreamSettings(url=URL, name=name, publisher_confirms=confirms,
                              prefetch_count=1000)
    plane = KombuStreamDataPlane(settings)
    try:
        pub = plane.stream_publisher()
        pub.publish(BODY)  # connect + declare outside the timing
        t0 = time.perf_counter()
        for _ in range(n - 1):
            pub.publish(BODY)
        pub_rate = (n - 1) / (time.perf_counter() - t0)
        pub.close()
        results = {"scenario": "kombu_stream", "messages": n, "body_bytes": len(BODY),
                   "publisher_confirms": confirms, "publish_per_s": round(pub_rate)}
        for label, offset, want in (("replay_first", "first", n),
                                    ("replay_from_middle", None, n // 2)):
            count = [0]
            mid_offset: list[int] = []
            done = threading.Event()

            def on_message(raw: bytes, off: int, want=want, count=count, done=done,
                           mid_offset=mid_offset) -> None:
                count[0] += 1
                if count[0] == n // 2:
                    mid_offset.append(off)
                if count[0] == want:
                    done.set()

            if offset is None:
                offset = results["_mid"]
            consumer = plane.stream_consumer()
            t0 = time.perf_counter()
            consumer.start(on_message, offset)
            done.wait(120)
            rate = count[0] / (time.perf_counter() - t0)
            consumer.stop()
            results[f"{label}_per_s"] = round(rate)
            if mid_offset:
                results["_mid"] = mid_offset[0]
        results.pop("_mid", None)
        print(json.dumps(results))
    finally:
        plane.close()
        delete_stream(URL, name)


def inprocess_run(n: int) -> None:
    bus = InProcessBus(threaded=False)
    pub = bus.stream_publisher()
    bus.stream_consumer().start(lambda raw, off: None)
    t0 = time.perf_counter()
    for i in range(n):
        pub.publish(BODY)
        if i % 100 == 99:
            bus.pump()
    bus.pump()
    sync_rate = n / (time.perf_counter() - t0)

    tbus = InProcessBus(threaded=True)
    tpub = tbus.stream_publisher()
    done = threading.Event()
    count = [0]

    def on_message(raw: bytes, off: int) -> None:
        count[0] += 1
        if count[0] == n:
            done.set()

    tbus.stream_consumer().start(on_message)
    t0 = time.perf_counter()
    for _ in range(n):
        tpub.publish(BODY)
    done.wait(60)
    threaded_rate = n / (time.perf_counter() - t0)
    tbus.close()
    print(json.dumps({"scenario": "inprocess", "messages": n,
                      "sync_publish_and_deliver_per_s": round(sync_rate),
                      "threaded_publish_and_deliver_per_s": round(threaded_rate)}))


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    kombu_run(count, confirms=True)
    kombu_run(count, confirms=False)
    inprocess_run(max(count, 200000))
