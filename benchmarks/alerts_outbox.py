"""Alerts/s through the durable outbox to a local receiver, at a fixed anomaly rate.

Every anomaly is its own incident (a distinct template), so every anomaly
becomes an alert: the worst case for the outbox (grouping would shrink it).
Anomalies are `put` through the serve-side AlertSink (SQLite WAL, fsync per
put with `synchronous: full`) in batches at `--rate` per second; its
background worker delivers over HTTP to a minimal keep-alive receiver in a
separate process. Reported: offered and delivered alerts/s, and how far
delivery lagged behind the last put. The outbox is not the bottleneck when
delivered/s matches the offered rate and the lag stays small.

    .venv/bin/python benchmarks/alerts_outbox.py --rate 1000 --seconds 10
    .venv/bin/python benchmarks/alerts_outbox.py --rate 0 --count 5000   # as fast as possible
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import tempfile
import time
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import httpx
import yaml

from logstream.alerts.pipeline import open_alert_sink
from logstream.records import Anomaly


def _receiver(port_out: Synchronized, count: Synchronized) -> None:  # type: ignore[type-arg]
    """HTTP/1.1 keep-alive server answering 200 to every POST, counting them."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                with count.get_lock():
                    count.value += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port_out.value = server.sockets[0].getsockname()[1]
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _routes(tmp: Path, port: int, concurrency: int, synchronous: str) -> Path:
    doc = {
        # one group per template (the incident): the default groups by stream, which
        # would fold this benchmark's distinct incidents into its 50 streams
        "route": {"receiver": "bench", "group_wait": "0s", "group_by": ["template"]},
        "receivers": [{"name": "bench", "webhook_configs": [{"url": f"http://127.0.0.1:{port}/"}]}],
        "delivery": {
            "outbox": str(tmp / "outbox.sqlite"),
            "concurrency": concurrency,
            "poll_interval": "50ms",
            "synchronous": synchronous,
        },
    }
    path = tmp / "alerts.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _anomaly(i: int, incidents: int) -> Anomaly:
    """Anomaly i; it belongs to incident i (or i mod `incidents` when that is > 0)."""
    incident = i % incidents if incidents else i
    return Anomaly(
        stream=f"bench-{incident % 50}", line=f"ERROR request {i} failed", score=9.0,
        threshold=4.0, surprisal=9.0, severity="critical", template_id=incident,
        template=f"ERROR request <NUM> failed (incident {incident})", top_tokens=(("failed", 8.0),), model_id="bench",
    )  # fmt: skip


def client_ceiling(port: int, seconds: float = 2.0) -> float:
    """Requests/s of one httpx client posting an alert-sized body with nothing else to do:
    the reference for what the outbox's bookkeeping costs on top of HTTP."""
    body = {"alerts": [{"annotations": {"line": "x" * 800}}]}
    sent, start = 0, time.perf_counter()
    with httpx.Client() as client:
        while time.perf_counter() - start < seconds:
            client.post(f"http://127.0.0.1:{port}/", json=body)
            sent += 1
    return sent / (time.perf_counter() - start)


def run(
    rate: float, count: int, batch: int, incidents: int, concurrency: int, synchronous: str
) -> dict[str, float]:
    alerts = min(count, incidents) if incidents else count  # group_wait 0, no repeat within 1h
    ctx = mp.get_context("spawn")
    port, received = ctx.Value("i", 0), ctx.Value("i", 0)
    server = ctx.Process(target=_receiver, args=(port, received), daemon=True)
    server.start()
    deadline = time.monotonic() + 10
    while port.value == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    ceiling = client_ceiling(port.value)
    with received.get_lock():
        received.value = 0
    with tempfile.TemporaryDirectory() as tmp:
        sink = open_alert_sink(_routes(Path(tmp), port.value, concurrency, synchronous))
        put_seconds = 0.0
        start = time.perf_counter()
        for first in range(0, count, batch):
            if rate > 0:  # pace: batch k starts at k*batch/rate
                time.sleep(max(0.0, start + first / rate - time.perf_counter()))
            t = time.perf_counter()
            sink.put([_anomaly(i, incidents) for i in range(first, min(count, first + batch))])
            put_seconds += time.perf_counter() - t
        last_put = time.perf_counter()
        deadline = time.monotonic() + 120
        while received.value < alerts and time.monotonic() < deadline:
            time.sleep(0.005)
        done = time.perf_counter()
        sink.close()
    server.terminate()
    return {
        "anomalies": count,
        "offered_per_s": round(count / (last_put - start), 1),
        "alerts": alerts,
        "delivered": received.value,
        "alerts_per_s": round(received.value / (done - start), 1),
        "lag_after_last_put_s": round(done - last_put, 3),
        "put_ms_per_batch": round(1000 * put_seconds / -(-count // batch), 3),
        "http_client_alone_per_s": round(ceiling, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="anomalies/s offered (0 = flat out)")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration at --rate")
    parser.add_argument("--count", type=int, default=None, help="anomalies (default rate x seconds)")
    parser.add_argument("--batch", type=int, default=10, help="anomalies per put (one fsync each)")
    parser.add_argument("--incidents", type=int, default=0, help="distinct incidents (0 = each anomaly)")
    parser.add_argument("--concurrency", type=int, default=8, help="HTTP sends in flight")
    parser.add_argument("--synchronous", choices=["full", "normal"], default="full")
    args = parser.parse_args()
    count = args.count or int(args.rate * args.seconds)
    result = run(args.rate, count, args.batch, args.incidents, args.concurrency, args.synchronous)
    sys.stdout.write(json.dumps({**vars(args), **result}) + "\n")
    return 0 if result["delivered"] == result["alerts"] else 1


if __name__ == "__main__":
    sys.exit(main())
