"""Typed errors raised by library code. Only the CLI turns them into messages and exit codes."""

from __future__ import annotations


class FastscoreError(Exception):
    """Base of every error fastscore raises on purpose; the CLI prints its message without a traceback."""

    exit_code = 1


class UnknownModelError(FastscoreError):
    exit_code = 2


class UnknownQuantError(FastscoreError):
    exit_code = 2


class UnknownBackendError(FastscoreError):
    exit_code = 2


class MissingDependencyError(FastscoreError):
    """An optional dependency is not installed; the message names the pip extra that provides it."""

    exit_code = 3

    def __init__(self, package: str, extra: str, message: str | None = None):
        self.package = package
        self.extra = extra
        super().__init__(
            message or f"{package} is not installed; install the extra with: pip install 'fastscore-cpu[{extra}]'"
        )


class ArtefactUnavailableError(FastscoreError):
    """A model artefact is not local and cannot be fetched (e.g. the hub is unreachable)."""

    exit_code = 4


class ModelLoadError(ArtefactUnavailableError):
    """An artefact exists but the backend cannot load it (not a valid file, unsupported architecture)."""


class DamagedArtefactError(ModelLoadError):
    """A cached or shipped artefact is not what was built: wrong size or hash, unreadable, or non-finite weights.
    The message names the artefact and the command that rebuilds it."""


class BackendError(FastscoreError):
    """The inference engine failed at run time (e.g. llama_decode returned an error)."""


class ConversionError(FastscoreError):
    exit_code = 5


class ConversionCheckError(ConversionError):
    """A converted artefact was read back and failed its check."""


class RequestError(FastscoreError):
    """Malformed scoring input; `line` is the 1-based JSONL line when known."""

    exit_code = 6

    def __init__(self, message: str, line: int | None = None, request_id: object = None):
        self.line = line
        self.request_id = request_id
        where = []
        if line is not None:
            where.append(f"line {line}")
        if request_id is not None:
            where.append(f"request {request_id!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class ContextTooLongError(RequestError):
    pass


class TokenizationError(FastscoreError):
    pass


class UnsupportedError(FastscoreError):
    """The chosen backend lacks a capability (see its class attributes)."""

    exit_code = 2


class DataError(FastscoreError):
    """Missing or malformed study data files."""

    exit_code = 7


class ResumeConfigError(FastscoreError):
    """`--resume` was asked for an output folder written with a different configuration."""

    exit_code = 8


class BenchmarkError(FastscoreError):
    """A benchmark worker process failed; the message carries its error."""

    exit_code = 9


class SandboxUnavailableError(FastscoreError):
    """The isolating sandbox (bubblewrap) is missing or cannot create its namespaces on this host."""

    exit_code = 3


class OutputError(FastscoreError):
    """An output cannot be written safely: it is an input, another run holds it, or it is not writable."""

    exit_code = 10


class SweepError(FastscoreError):
    """A sweep shard failed where it ran (a Ray worker, or a worker that kept dying); the message names the shard."""

    exit_code = 11


class ReproductionError(FastscoreError):
    """Committed study rows are not reproduced by the running code (a sharded run's mixing check, or verify)."""

    exit_code = 12
