"""One error tree for the Kubernetes boundary (httpx's ``_exceptions.py`` is the model).

Every call the k8s layer makes goes through :func:`translated`, so components catch what
happened (``except NotFound``) instead of lightkube's ``ApiError`` plus a status-code check::

    KubeError                   the Kubernetes API could not be used
    ├── ClientConfigError       no usable kubeconfig / in-cluster account
    ├── Unreachable             transport failure (refused, reset, timed out, TLS)  [transient]
    ├── ProxyError              a GET through the API server's pod proxy failed
    └── StatusError             the API server answered with an error status
        ├── BadRequest          400
        ├── Unauthorized        401
        ├── Forbidden           403
        ├── NotFound            404
        ├── Conflict            409 (a stale resourceVersion)                  [transient]
        │   ├── AlreadyExists   409 AlreadyExists (a create of a taken name)
        │   └── PreconditionFailed  409: a delete's UID or resourceVersion precondition
        │                           did not hold (another object, or it changed)
        ├── Gone                410 (a watch's resourceVersion expired)
        ├── Invalid             422
        ├── TooManyRequests     429                                           [transient]
        └── ServerError         5xx                                           [transient]
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterable, Iterator
from typing import TypeVar

import httpx2
from lightkube import ApiError

T = TypeVar("T")


class KubeError(Exception):
    """The Kubernetes API could not be used (unreachable, refused, or an unexpected answer)."""


class ClientConfigError(KubeError):
    """No usable client configuration (kubeconfig, context or in-cluster account)."""


class Unreachable(KubeError):
    """The API server could not be reached or the connection broke."""


class ProxyError(KubeError):
    """A GET through the API server's pod proxy failed; ``code`` is its HTTP status."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class StatusError(KubeError):
    """The API server answered with an error status; ``code``, ``reason`` and ``message`` are
    from its Status object."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message


class BadRequest(StatusError):
    pass


class Unauthorized(StatusError):
    pass


class Forbidden(StatusError):
    pass


class NotFound(StatusError):
    pass


class Conflict(StatusError):
    """The object changed since it was read (or, as :class:`AlreadyExists`, exists)."""


class AlreadyExists(Conflict):
    pass


class PreconditionFailed(Conflict):
    """A delete's preconditions (``DeleteOptions.preconditions``: the UID, the resourceVersion)
    did not hold: the object of that name is another one, or changed since it was read. Not
    transient: read it again and decide again."""


class Gone(StatusError):
    """The resourceVersion is too old (a watch must list again)."""


class Invalid(StatusError):
    pass


class TooManyRequests(StatusError):
    pass


class ServerError(StatusError):
    pass


_BY_CODE: dict[int, type[StatusError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    410: Gone, 422: Invalid, 429: TooManyRequests,
}  # fmt: skip


def _typed(code: int, reason: str, message: str) -> StatusError:
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExists(code, reason, message)
    if code == 409 and "Precondition failed" in message:  # the API server's words, as is
        return PreconditionFailed(code, reason, message)
    kind = _BY_CODE.get(code) or (ServerError if code >= 500 else StatusError)
    return kind(code, reason, message)


def from_api_error(e: ApiError) -> StatusError:
    """The typed error for lightkube's ``ApiError``."""
    return _typed(int(e.status.code or 0), e.status.reason or "", e.status.message or str(e))


def from_http_status(e: httpx2.HTTPStatusError) -> StatusError:
    """The typed error for an error answer lightkube leaves as httpx's: a watch that could not
    start (lightkube checks its status with httpx alone), or a body whose Content-Type is not
    exactly ``application/json`` (a proxy's page, say). A Status in the body, if it was read,
    gives the reason and message."""
    response = e.response
    reason, message = response.reason_phrase, str(e).splitlines()[0]
    try:
        body = json.loads(response.content)
    except Exception:  # a watch's body is not read; a proxy's is not JSON
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or message)
    return _typed(response.status_code, reason, message)


def translate(e: BaseException) -> KubeError | None:
    """The typed error for an exception of the client libraries; None for anything else."""
    if isinstance(e, KubeError):
        return e
    if isinstance(e, ApiError):
        return from_api_error(e)
    if isinstance(e, httpx2.HTTPStatusError):
        return from_http_status(e)
    if isinstance(e, httpx2.TransportError):
        return Unreachable(f"cannot reach the Kubernetes API: {type(e).__name__}: {e}")
    return None


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Raise the client libraries' errors as :class:`KubeError` subclasses (chained)."""
    try:
        yield
    except (httpx2.HTTPStatusError, httpx2.TransportError) as e:  # ApiError is an HTTPStatusError
        typed = translate(e)
        assert typed is not None
        raise typed from e


async def translated_stream(stream: AsyncIterable[T]) -> AsyncGenerator[T, None]:
    """``stream`` (a watch) with its errors translated; closing this closes ``stream``."""
    iterator = aiter(stream)
    try:
        with translated():
            async for item in iterator:
                yield item
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


def is_transient(e: BaseException) -> bool:
    """Errors worth retrying: transport failures, conflicts, throttling and server trouble."""
    typed = translate(e)
    if isinstance(typed, AlreadyExists | PreconditionFailed):
        return False
    return isinstance(typed, Unreachable | Conflict | TooManyRequests | ServerError)


def describe(e: BaseException) -> str:
    """One line for logs and errors: the typed error's text, else the exception's."""
    typed = translate(e)
    if typed is not None:
        return str(typed)
    return f"{type(e).__name__}: {e}"
