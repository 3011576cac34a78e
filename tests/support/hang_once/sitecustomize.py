"""A hang for the stall watchdog's end-to-end test (tests/e2e/test_fleet.py), loaded by every
Python process started with this folder on PYTHONPATH (a node and its executors): the first
executor that loads a model blocks there for good, as a run hung in "Loading weights" does,
while its heartbeat thread goes on. Later ones load normally. ``TRAINHUB_TEST_HANG_ONCE`` names
the file that records that the hang was used; without it nothing is changed."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
from typing import Any

_USED = os.environ.get("TRAINHUB_TEST_HANG_ONCE", "")
_TARGET = "gpu_worker.backends.peft_backend"


def _first_time() -> bool:
    try:
        os.close(os.open(_USED, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class _HangOnLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        run_module = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run_module(module)
            load = module.load

            def hanging_load(spec: Any) -> Any:
                if _first_time():
                    threading.Event().wait()  # for ever: only a signal ends this process
                return load(spec)

            module.load = hanging_load

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _USED:
    sys.meta_path.insert(0, _HangOnLoad())
