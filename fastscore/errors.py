"""Typed errors raised by library code. Only the CLI turns them into messages and exit codes (fastscore.cli.app).

Exit codes (each error class below carries its own; README's table lists the same):
0 success; 1 an internal or backend error at run time; 2 unknown model, backend or quant, a capability the backend
lacks, or conflicting settings (SettingsError); 3 a missing optional dependency or no working sandbox; 4 an artefact
unavailable, unloadable or damaged; 5 a conversion failed; 6 a malformed scoring request or a context too long;
7 study data; 8 `--resume` with other settings; 9 a benchmark worker failed; 10 an output cannot be written
safely: it or a name derived from it is an input or another output, another run holds its lock (OutputBusyError),
it is not writable or the disk is full; 11 a sweep shard failed; 130 interrupted.
"""

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


class ServerBusyError(FastscoreError):
    """`fastscore serve`: the batching queue already holds its maximum of waiting requests (HTTP 503)."""


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


class RequestTooLargeError(RequestError):
    """`fastscore serve`: more work in one request than the server accepts (HTTP 413)."""


class TokenizationError(FastscoreError):
    pass


class UnsupportedError(FastscoreError):
    """The chosen backend lacks a capability (see its class attributes)."""

    exit_code = 2


class SettingsError(FastscoreError):
    """Settings that contradict each other or the model (n_ctx given twice with different values, an n_ctx beyond
    the context the model was trained on)."""

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
    """An output cannot be written safely: it (or a file derived from its name) is an input or another output,
    another run holds it, it is not writable, or the disk is full."""

    exit_code = 10


class OutputBusyError(OutputError):
    """Another run holds the output's lock (the message names the holder); same exit code as every OutputError."""


class SweepError(FastscoreError):
    """A sweep shard failed where it ran (a Ray worker, or a worker that kept dying); the message names the shard."""

    exit_code = 11


class ReproductionError(FastscoreError):
    """Committed study rows are not reproduced by the running code (a sharded run's mixing check, or verify)."""

    exit_code = 12
