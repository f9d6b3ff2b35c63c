"""Test helpers for the MBPP sandbox: an interpreter the rlimits mode can run as `nobody` when the tests run as root."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Iterator

from fastscore.study.data.envs.mbpp.isolation import PYTHON_ENV, rlimits_problem

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@contextlib.contextmanager
def rlimits_python() -> Iterator[None]:
    """As root, --sandbox rlimits runs programs as `nobody`, who cannot reach an interpreter under /root (e.g. a
    pyenv): within the block such runs use the system's python3, as a user would via $FASTSCORE_SANDBOX_PYTHON."""
    previous = os.environ.get(PYTHON_ENV)
    if previous is None and rlimits_problem() is not None and SYSTEM_PYTHON:
        os.environ[PYTHON_ENV] = SYSTEM_PYTHON
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(PYTHON_ENV, None)
