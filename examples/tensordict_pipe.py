"""tensordict's pipe, from tensorwire: change the import, keep the code.

    python examples/tensordict_pipe.py [COUNT]
Listens on a free port, connects to itself, streams COUNT tensordict.TensorDicts of a
replay-buffer-like shape through the pipe and checks every one; prints one line.
"""
from __future__ import annotations

import asyncio
import sys

import torch
from tensordict import TensorDict, TensorDictBase

from tensorwire.tensordict import TensorDictPipe  # was: from tensordict._ucxx import TensorDictPipe


def batch(step: int) -> TensorDict:
    return TensorDict({"obs": torch.full((16, 8), float(step)), "next": {"reward": torch.arange(16) + step}},
                      batch_size=[16]).consolidate()


async def receive(count: int, port: asyncio.Future[int]) -> list[float]:
    pipe = await TensorDictPipe.listen(0, on_listening=port.set_result)  # 0: a free port
    seen: list[float] = []
    for _ in range(count):
        td: TensorDictBase = await pipe.arecv()
        assert bool((td["next", "reward"] == torch.arange(16) + int(td["obs"][0, 0])).all())
        seen.append(float(td["obs"][0, 0]))
    await pipe.aclose()
    return seen


async def main(count: int) -> None:
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    receiver = asyncio.create_task(receive(count, port))
    pipe = await TensorDictPipe.connect("127.0.0.1", await asyncio.wait_for(port, 30))
    for step in range(count):
        await pipe.asend(batch(step))
    seen = await asyncio.wait_for(receiver, 30)
    await pipe.aclose()
    assert seen == [float(s) for s in range(count)], seen
    print(f"tensordict_pipe: {count} TensorDicts sent and checked")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
