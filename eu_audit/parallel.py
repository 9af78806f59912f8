"""The one way eu-audit runs jobs side by side: sessions on a served engine (``record --concurrency``) and
tenants of a deployed agent (``eu-audit gate --tenants-in-flight``) both go through ``in_job_order``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

J = TypeVar("J")
R = TypeVar("R")


def in_job_order(jobs: Sequence[J], run: Callable[[J], R], workers: int, *, name: str) -> list[R]:
    """``run`` on every job, the results in the jobs' order: one after another with one worker, else
    ``workers`` threads named ``name``. The first failure is raised as it is, after the jobs already
    running finish (a thread cannot be stopped) and the jobs not yet started are cancelled, so a broken
    run stops in the time of one job, not of all of them. An interruption (^C, SIGTERM) does not wait even
    for those: it is raised at once, the jobs running are left to the process's end (``abandoned``), so
    the caller keeps what finished and exits within seconds, not when a slow agent answers."""
    if workers <= 1:
        return [run(job) for job in jobs]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    try:
        futures = [pool.submit(run, job) for job in jobs]
        results = [f.result() for f in futures]
    except (KeyboardInterrupt, SystemExit):
        pool.shutdown(wait=False, cancel_futures=True)
        abandoned.set()
        raise
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results


#: set when an interruption left jobs running (``in_job_order``): the CLI then ends the process without
#: joining their threads, once its outputs are written (``cli.app.main``)
abandoned = threading.Event()
