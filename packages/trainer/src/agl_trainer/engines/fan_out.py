"""What the trainer asks of its engine, asked of every engine server at once: on a cluster agl runs one vLLM server
per node (agl_trainer.engines.fleet), and sleep, wake, adapter loads and unloads, weight reloads and prefix-cache
resets must reach each of them, or one node serves other weights than the rest.

A request that fails on a server which has since died is not an error of the request: the fleet reports the lost
server (its node and its log's tail) and drops it, and the run goes on with the rest; only when none is left, or a
living server refused, does the request fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def engine_urls(base_url: str, servers: Any) -> list[str]:
    """The base URLs (ending in /v1) of the engine servers alive now: the fleet's (`servers.urls()`), else the
    one URL."""
    urls = getattr(servers, "urls", None)
    return list(urls()) if callable(urls) else [base_url]


def root_of(base_url: str) -> str:
    """`http://host:port/v1` → `http://host:port` (vLLM's development routes live at the root)."""
    url = base_url.rstrip("/")
    return url.removesuffix("/v1")


def each_server(urls: Sequence[str], call: Callable[[str], T], servers: Any = None) -> list[T]:
    """`call(url)` for every URL, all at once; the results of those that answered. A failure on a server that has
    died since is excused (`servers.check_alive()` reports and drops it, and raises when none is left); any other
    failure raises, naming every server that failed."""
    from agl_trainer.backends import EngineError  # backends fans out through here

    if len(urls) == 1:
        try:
            return [call(urls[0])]
        except EngineError:
            _excused(urls, servers)  # raises when that server is alive (the request's fault) or was the last
            raise
    with ThreadPoolExecutor(max_workers=min(len(urls), 16), thread_name_prefix="agl-fan-out") as pool:
        futures = {url: pool.submit(call, url) for url in urls}
    results: list[T] = []
    failures: dict[str, BaseException] = {}
    for url, future in futures.items():
        error = future.exception()
        if error is None:
            results.append(future.result())
        else:
            failures[url] = error
    if failures:
        alive = _excused(list(failures), servers)
        failures = {url: error for url, error in failures.items() if url in alive}
    if failures:
        if len(failures) == 1:
            raise next(iter(failures.values()))
        raise EngineError(
            f"{len(failures)} of {len(urls)} engine servers failed: " + " | ".join(map(str, failures.values()))
        )
    return results


def _excused(failed: Sequence[str], servers: Any) -> set[str]:
    """Of the `failed` URLs, those of servers still alive (whose failure stands); the others were lost, and the
    fleet has reported them. Raises when no server is left."""
    check = getattr(servers, "check_alive", None)
    if not callable(check) or not hasattr(servers, "urls"):
        return set(failed)
    check()
    alive = set(servers.urls())
    return {url for url in failed if url in alive}
