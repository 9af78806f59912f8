"""The one way eu-audit runs jobs side by side: sessions on a served engine (``record --concurrency``) and
tenants of a deployed agent (``eu-audit gate --tenants-in-flight``) both go through ``in_job_order``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

J = TypeVar("J")
R = TypeVar("R")


def in_job_order(jobs: Sequence[J], run: Callable[[J], R], workers: int, *, name: str) -> list[R]:
    """``run`` on every job, the results in the jobs' order: one after another with one worker, else
    ``workers`` threads named ``name``. The first failure is raised as it is, after the jobs already
    running finish (a thread cannot be stopped) and the jobs not yet started are cancelled, so a broken
    run stops in the time of one job, not of all of them."""
    if workers <= 1:
        return [run(job) for job in jobs]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    try:
        futures = [pool.submit(run, job) for job in jobs]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
