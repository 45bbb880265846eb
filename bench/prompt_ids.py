"""What a long token-ID prompt costs the proxy: parse and check time, and how long the event
loop waits meanwhile.

    python -m bench.prompt_ids [--ids N] [--max-prompt-ids M]

Each body (Path A JSON, Path B msgpack and protobuf) holds N random IDs of SmolLM2's 49 152-token
vocabulary and goes through the core parser the handlers call. `parse` is its time on the
calling thread (best of 3); `loop stall` is the longest an asyncio timer firing every
millisecond waited while the same parse ran in a worker thread, as the handlers run it
(proxy/server/control/generation.py). With M < N, the time to the 413 `prompt_too_long`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import Callable

import msgpack
import orjson

from proxy.core.endpoints import COMPLETIONS
from proxy.core.errors import PayloadTooLarge
from proxy.core.wire import codec_pb2
from proxy.core.wire.codec_request import decode_codec_request
from proxy.core.wire.prompt_ids import PromptLimits

VOCAB = 49152


def bodies(count: int) -> dict[str, Callable[[PromptLimits], object]]:
    ids = [random.randrange(VOCAB) for _ in range(count)]
    as_json = orjson.dumps({"prompt": ids, "stream_format": "msgpack", "max_tokens": 16})
    as_msgpack = msgpack.packb({"prompt_ids": ids, "max_tokens": 16})
    as_protobuf = codec_pb2.CodecRequest(prompt_ids=ids, max_tokens=16).SerializeToString()
    print(
        f"{count} IDs: JSON {len(as_json) / 2**20:.1f} MiB, msgpack "
        f"{len(as_msgpack) / 2**20:.1f} MiB, protobuf {len(as_protobuf) / 2**20:.1f} MiB"
    )
    return {
        "Path A JSON": lambda limits: COMPLETIONS.parse_request(as_json, limits),
        "Path B msgpack": lambda limits: decode_codec_request(
            as_msgpack, "application/x-msgpack", limits
        ),
        "Path B protobuf": lambda limits: decode_codec_request(
            bytes(as_protobuf), "application/x-protobuf", limits
        ),
    }


def run(parse: Callable[[PromptLimits], object], limits: PromptLimits) -> None:
    with contextlib.suppress(PayloadTooLarge):
        parse(limits)


def best_time(parse: Callable[[PromptLimits], object], limits: PromptLimits) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run(parse, limits)
        times.append(time.perf_counter() - start)
    return min(times)


async def loop_stall(parse: Callable[[PromptLimits], object], limits: PromptLimits) -> float:
    worst = 0.0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal worst
        while not done.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - start - 0.001)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    await asyncio.to_thread(run, parse, limits)
    done.set()
    await ticker
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=2_000_000)
    parser.add_argument("--max-prompt-ids", type=int, default=None, help="default: --ids")
    args = parser.parse_args()
    limits = PromptLimits(VOCAB, args.max_prompt_ids or args.ids)
    print(f"max_prompt_ids {limits.max_ids}")
    for name, parse in bodies(args.ids).items():
        parse_ms = best_time(parse, limits) * 1000
        stall_ms = asyncio.run(loop_stall(parse, limits)) * 1000
        print(f"{name:16} parse {parse_ms:7.1f} ms   loop stall {stall_ms:6.1f} ms")


if __name__ == "__main__":
    main()
