"""tensorwire.tensordict: tensordict's pipe API, unchanged code, tensorwire underneath."""
import asyncio
import contextlib
import os
import sys

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from test_pipe import finish, py_peer, tls  # noqa: F401  (fixture re-exported)
from tensorwire.tensordict import TensorDictPipe, TensorDictServer


def test_tensordict_code_runs_unchanged_with_td_send_and_steady_state_identity(tls):
    async def run():
        ports = []
        listen = asyncio.ensure_future(TensorDictPipe.listen(0, on_listening=ports.append))
        while not ports:
            await asyncio.sleep(0.01)
        peer = py_peer("send", "127.0.0.1", ports[0], 4, "--dropin")  # uses td.send(pipe)
        pipe = await asyncio.wait_for(listen, 30)
        first = await asyncio.wait_for(pipe.arecv(), 30)
        assert isinstance(first, TensorDict) and first.batch_size == torch.Size([4])
        assert first.is_consolidated()
        x = first["x"]
        for i in range(1, 4):
            td = await asyncio.wait_for(pipe.arecv(), 30)
            assert td is first  # the same object, as tensordict's own pipe does
            assert x[0].item() == i  # torch views over the received storage
            assert td["nested", "y"].tolist() == [i, i + 1, i + 2, i + 3]
            assert td["label"] == "step"
        await pipe.aclose()
        assert finish(peer)[0] == 0
    asyncio.run(run())


def test_td_recv_dispatches_to_the_pipe(tls):
    async def run():
        ports = []
        listen = asyncio.ensure_future(TensorDictPipe.listen(0, on_listening=ports.append))
        while not ports:
            await asyncio.sleep(0.01)
        peer = py_peer("send", "127.0.0.1", ports[0], 2, "--dropin")
        pipe = await asyncio.wait_for(listen, 30)
        got = await asyncio.get_running_loop().run_in_executor(None, lambda: TensorDict().recv(pipe))
        assert got["x"][0].item() == 0
        await pipe.aclose()
        finish(peer)
    asyncio.run(run())


def test_non_json_non_tensor_raises_valueerror_before_sending(tls):
    async def run():
        server = TensorDictServer(0, consolidated=False)
        accepted = []

        async def handler(pipe):
            accepted.append(pipe)

        task = asyncio.ensure_future(server.serve(handler))
        client = await TensorDictPipe.connect("127.0.0.1", server.port, consolidated=False)
        bad = TensorDict({"x": torch.zeros(2), "obj": NonTensorData(object())}, batch_size=[2])
        with pytest.raises(ValueError, match="obj"):
            await client.asend(bad)
        ok = TensorDict({"x": torch.ones(2), "s": "fine"}, batch_size=[2])
        await client.asend(ok)
        for _ in range(200):
            if accepted:
                break
            await asyncio.sleep(0.05)
        got = await asyncio.wait_for(accepted[0].arecv(), 30)
        assert got["x"].tolist() == [1.0, 1.0] and got["s"] == "fine"
        await client.aclose()
        server.close()
        await asyncio.wait_for(task, 10)
    asyncio.run(run())


@contextlib.asynccontextmanager
async def _served_client(consolidated=True):
    """(client, pipes): a client of a TensorDictServer whose accepted pipes land in pipes."""
    server = TensorDictServer(0, consolidated=consolidated)
    pipes = []
    task = asyncio.ensure_future(server.serve(lambda p: _append(pipes, p)))
    client = await TensorDictPipe.connect("127.0.0.1", server.port, consolidated=consolidated)
    try:
        yield client, pipes
    finally:
        await client.aclose()
        server.close()
        await asyncio.wait_for(task, 10)


async def _first_pipe(pipes):
    while not pipes:
        await asyncio.sleep(0.02)
    return pipes[0]


def test_dicts_with_a_device_are_sent_as_tensordicts_pipe_sends_them(tls):
    async def run():
        async with _served_client() as (client, pipes):
            sent = [TensorDict({"a": torch.ones(3)}, [3], device="cpu").consolidate(),
                    TensorDict({"a": torch.full((3,), 2.0)}, [3], device="cpu"),
                    TensorDict({"a": torch.full((3,), 3.0)}, [3]).to("cpu")]
            for td in sent:
                await client.asend(td)
            server_end = await _first_pipe(pipes)
            for i in range(3):
                got = await asyncio.wait_for(server_end.arecv(), 30)
                assert got["a"].tolist() == [i + 1.0] * 3 and got.device == torch.device("cpu")
    asyncio.run(run())


def test_a_tensorclass_is_sent_as_its_tensordict_as_tensordicts_pipe_sends_it(tls):
    from tensordict import tensorclass

    @tensorclass
    class Obs:
        obs: torch.Tensor
        rew: torch.Tensor

    async def run():
        async with _served_client() as (client, pipes):
            await client.asend(Obs(obs=torch.arange(3.0), rew=torch.ones(3), batch_size=[3]))
            got = await asyncio.wait_for((await _first_pipe(pipes)).arecv(), 30)
            assert isinstance(got, TensorDict) and got["obs"].tolist() == [0.0, 1.0, 2.0]
            assert got.batch_size == torch.Size([3])
    asyncio.run(run())


def test_async_for_ends_when_another_task_closes_the_pipe(tls):
    """As tensordict's: the loop ends (a dead peer still raises, unlike tensordict's)."""
    async def run():
        async with _served_client() as (client, pipes):
            await client.asend(TensorDict({"a": torch.zeros(2)}, [2]))
            server_end = await _first_pipe(pipes)
            got = []

            async def consume():
                async for td in server_end:
                    got.append(td["a"].tolist())
                    server_end.close()  # another task's close, as far as the loop knows
            await asyncio.wait_for(consume(), 30)
            assert got == [[0.0, 0.0]]
    asyncio.run(run())


def test_sender_side_consolidated_input_is_sent_from_its_own_storage(tls):
    async def run():
        async with _served_client() as (client, pipes):
            td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}},
                            batch_size=[2]).consolidate()
            await client.asend(td)
            wire_view = client._out_cache[2]
            assert wire_view.storage.ctypes.data == td._consolidated["storage"].data_ptr()  # no copy
            td["a"][0, 0] = 42  # steady state: same dict, new values
            await client.asend(td)
            server_end = await _first_pipe(pipes)
            r1 = await server_end.arecv()
            r2 = await server_end.arecv()
            assert r1 is r2 and r2["a"][0, 0].item() == 42
    asyncio.run(run())


def test_a_lazy_stack_goes_dense_and_one_of_ragged_members_is_refused_by_name(tls):
    from tensordict import LazyStackedTensorDict

    async def run():
        async with _served_client() as (client, pipes):
            ragged = LazyStackedTensorDict.lazy_stack(
                [TensorDict({"x": torch.zeros(2)}), TensorDict({"x": torch.ones(3)})])
            for bad in (ragged, ragged.consolidate()):
                with pytest.raises(ValueError, match="LazyStackedTensorDict whose members differ"):
                    await client.asend(bad)
            even = LazyStackedTensorDict.lazy_stack(
                [TensorDict({"x": torch.zeros(2)}), TensorDict({"x": torch.ones(2)})])
            for td in (even, even.consolidate()):
                await client.asend(td)  # the pipe still works after the refusals
            server_end = await _first_pipe(pipes)
            for _ in range(2):
                got = await asyncio.wait_for(server_end.arecv(), 30)
                assert got.batch_size == torch.Size([2]) and got["x"].tolist() == [[0, 0], [1, 1]]
    asyncio.run(run())


def test_a_locked_dict_arrives_locked_and_an_unlocked_one_unlocked_as_tensordict(tls):
    async def run():
        async with _served_client() as (client, pipes):
            await client.asend(TensorDict({"a": torch.ones(3), "n": {"b": torch.ones(3)}}, [3]).lock_())
            await client.asend(TensorDict({"a": torch.ones(2)}, [2]))
            server_end = await _first_pipe(pipes)
            locked = await asyncio.wait_for(server_end.arecv(), 30)
            assert locked.is_locked and locked["n"].is_locked
            assert tw_from(locked).is_locked  # the conversion keeps it too
            unlocked = await asyncio.wait_for(server_end.arecv(), 30)
            assert not unlocked.is_locked
    asyncio.run(run())


@pytest.mark.parametrize("consolidated", [True, False], ids=["consolidated", "plain"])
def test_a_dtype_tensordict_cannot_consolidate_arrives_whole(tls, consolidated):
    # tensordict's table of dtypes lacks float8 (its own consolidate() raises KeyError):
    # the consolidated pipe gave the receiver KeyError 'torch.float8_e4m3fn' and lost it.
    async def run():
        async with _served_client(consolidated) as (client, pipes):
            sent = TensorDict({"f8": torch.linspace(-2, 2, 4).to(torch.float8_e4m3fn),
                               "x": torch.arange(4.0)}, [4])
            for _ in range(2):  # the first and the steady-state conversion
                await client.asend(sent)
            server_end = await _first_pipe(pipes)
            for _ in range(2):
                got = await asyncio.wait_for(server_end.arecv(), 30)
                assert got["f8"].dtype == torch.float8_e4m3fn
                assert torch.equal(got["f8"].view(torch.uint8), sent["f8"].view(torch.uint8))
                assert got["x"].tolist() == [0, 1, 2, 3]
    asyncio.run(run())


def tw_from(td):
    from tensorwire import TensorDict as TwTensorDict
    return TwTensorDict.from_tensordict(td)


async def _append(lst, p):
    lst.append(p)


@pytest.mark.parametrize("consolidated", [False, True], ids=["plain", "consolidated"])
def test_an_asend_cancelled_then_retried_with_the_same_dict_arrives_once(consolidated):
    # A plain (not consolidated) dict was converted anew at each call, so the retry did not
    # find the send in flight and the message arrived twice.
    async def run():
        ports = []
        listen = asyncio.ensure_future(TensorDictPipe.listen(0, on_listening=ports.append))
        while not ports:
            await asyncio.sleep(0.01)
        client = await TensorDictPipe.connect("127.0.0.1", ports[0])
        server = await asyncio.wait_for(listen, 30)
        td = TensorDict({"w": torch.zeros(10_000_000), "tag": torch.tensor(1)}, batch_size=[])
        if consolidated:
            td = td.consolidate()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.asend(td), 0.01)  # nobody receives yet: in flight
        tags = []

        async def receive():
            for _ in range(3):
                with contextlib.suppress(asyncio.TimeoutError):
                    tags.append(int((await asyncio.wait_for(server.arecv(), 5))["tag"]))

        receiving = asyncio.ensure_future(receive())
        await client.asend(td)  # the retry finishes the send in flight
        await client.asend(TensorDict({"w": torch.zeros(3), "tag": torch.tensor(3)}, batch_size=[]))
        await receiving
        assert tags == [1, 3]
        await client.aclose()
        await server.aclose()
    asyncio.run(run())
