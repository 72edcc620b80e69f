"""Datasets from the Hugging Face hub, asked once and quickly (``data=hf data.path=<hub name>``, ``eval=olmes``).

``datasets.load_dataset`` of a hub name with no network retries every request five times with back-off
(huggingface_hub's ``http_backoff``: ~25 s and a dozen log lines, each twice) before its error. Here the hub is
asked once first (:func:`unreachable`: one HEAD request to ``HF_ENDPOINT``, through huggingface_hub's own HTTP
session, so its proxy settings apply, and no retry); when it does not answer, the dataset is read from the cache
alone, as under ``HF_HUB_OFFLINE=1`` (:func:`cache_only`), and a dataset that is not there is
:class:`HubUnreachable`: the caller's one line, within seconds, before the run writes anything.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from lm_ablate.data.common import first_line
from lm_ablate.data.tokenizers import _quiet_requests

HUB_TIMEOUT_S = 5.0  # one request: a DNS failure or a refused connection answers at once, a silent network here


class HubUnreachable(Exception):
    """The hub cannot be reached and the dataset is not in the cache; the message says both in one line."""


def offline_mode() -> bool:
    """HF_HUB_OFFLINE (huggingface_hub) or HF_DATASETS_OFFLINE (datasets) is set."""
    import datasets
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE)


@functools.lru_cache(maxsize=4)
def _answer(endpoint: str, timeout: float) -> str | None:
    from huggingface_hub import get_session

    try:
        with _quiet_requests():  # an INFO line per request would create a refused run's log file under Hydra
            get_session().head(endpoint, timeout=timeout)  # any HTTP answer (even an error status) is an answer
    except Exception as e:  # no connection, DNS, TLS, timeout: the transport's own error
        return f"{endpoint} did not answer: {first_line(e)}"
    return None


def unreachable(timeout: float = HUB_TIMEOUT_S) -> str | None:
    """Why the hub cannot be asked now (offline mode set, or no answer to one request), else None. Asked once
    per process and endpoint (a task set of nine hub datasets pays one request)."""
    if offline_mode():
        return "offline mode is set: HF_HUB_OFFLINE or HF_DATASETS_OFFLINE"
    from huggingface_hub import constants

    return _answer(constants.ENDPOINT, timeout)


@contextlib.contextmanager
def cache_only() -> Iterator[None]:
    """``datasets`` and ``huggingface_hub`` read their caches only and make no request, as with HF_HUB_OFFLINE=1
    set before they were imported (their offline switches are module state read at each call; datasets' own
    tests switch them the same way); set back afterwards."""
    import datasets
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE = saved


def load_from_hub(path: str, *args: Any, cache_dir: str | None = None, **kwargs: Any) -> Any:
    """``datasets.load_dataset(path, *args, cache_dir=cache_dir, **kwargs)`` of a hub name: from the hub when it
    answers (its errors are the caller's to word), else from the cache alone; :class:`HubUnreachable` when it is
    not there either."""
    import datasets

    why = unreachable()
    if why is None:
        with _quiet_requests():
            return datasets.load_dataset(path, *args, cache_dir=cache_dir, **kwargs)
    where = cache_dir or datasets.config.HF_DATASETS_CACHE
    try:
        with cache_only(), _quiet_requests():
            return datasets.load_dataset(path, *args, cache_dir=cache_dir, **kwargs)
    except Exception as e:  # datasets: ConnectionError (offline) or FileNotFoundError when nothing is cached
        stream = " (data.streaming reads the hub itself)" if kwargs.get("streaming") else ""
        missing = isinstance(e, ConnectionError) or (isinstance(e, FileNotFoundError) and "is not cached" in str(e))
        cached = f"it is not in the cache {where}" if missing else f"the cache {where} cannot give it [{first_line(e)}]"
        raise HubUnreachable(f"the Hugging Face hub cannot be reached ({why}) and {cached}{stream}") from None
