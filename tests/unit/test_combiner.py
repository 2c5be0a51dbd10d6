"""The worker's combined calls (`_Combiner`): step records of many threads share one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from sinal.automations.dispatcher import _Combiner
from sinal.errors import StoreError, StoreUnavailable
from tests.helpers import wait_until


def _batched(failure: Exception) -> tuple[list[list[str]], list[Future[str]]]:
    """Three calls: "first" alone, then "bad" and "good" in one batch, which `failure`
    fails when it holds "bad"; the batches run and each call's future."""
    runs: list[list[str]] = []
    started, release = threading.Event(), threading.Event()

    def run(items: list[str]) -> list[str]:
        runs.append(items)
        if items == ["first"]:
            started.set()
            release.wait(10)
        if "bad" in items:
            raise failure
        return [f"{item}!" for item in items]

    combiner: _Combiner[str, str] = _Combiner(run)
    with ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(combiner.call, "first")]
        assert started.wait(10)
        calls += [pool.submit(combiner.call, item) for item in ("bad", "good")]
        wait_until(lambda: len(combiner._waiting) == 2)  # both wait for the next batch
        release.set()
    return runs, calls


def _raised(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:
        return exc
    return None


@pytest.mark.parametrize("failure", [StoreError("refused"), TypeError("not JSON")])
def test_an_item_the_batch_fails_on_fails_alone(failure: Exception) -> None:
    runs, [first, bad, good] = _batched(failure)

    assert runs == [["first"], ["bad", "good"], ["bad"], ["good"]]
    assert (first.result(), good.result()) == ("first!", "good!")
    assert _raised(bad.result) is failure


def test_an_unavailable_database_fails_the_whole_batch_at_once() -> None:
    failure = StoreUnavailable("connection lost")
    runs, [first, bad, good] = _batched(failure)

    assert runs == [["first"], ["bad", "good"]]  # no call per item: each would wait too
    assert first.result() == "first!"
    assert _raised(bad.result) is failure
    assert _raised(good.result) is failure
