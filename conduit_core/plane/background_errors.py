"""Failures that happen in the background worker, kept until a caller can be told.

The worker has no caller to raise to, so it reports each failure here; the next call
on the data plane raises them. Every failure is kept, never only the first: a second
failure hidden behind a first would lose the tickets of the rollouts it rejected.

The methods expect the caller to hold the data plane's condition; this class adds no
lock of its own (every ingest and deliver checks it).
"""

from __future__ import annotations

from ..errors import WorkerError


class BackgroundErrors:
    """Background failures not yet raised.

    Public contract: ``report_locked(err)`` keeps one; ``bool()`` says whether any is kept
    (the worker prepares nothing ahead while one is), as ``kept`` (the list, read-only for
    others: every data-plane call tests it without a Python call); ``take_locked()`` hands all
    of them over as one error and forgets them; ``raise_locked()`` raises that error, if any.
    """

    def __init__(self) -> None:
        self.kept: list[BaseException] = []

    def __bool__(self) -> bool:
        return bool(self.kept)

    def report_locked(self, err: BaseException) -> None:
        self.kept.append(err)

    def take_locked(self) -> BaseException | None:
        """Every background failure not yet raised, as one error (None if there is none):
        the only one, or a WorkerError listing all of them (``.errors``) with the union of
        their ``rejected_tickets``, so a second failure is never dropped behind a first."""
        errors = self.kept
        if not errors:
            return None
        self.kept = []
        if len(errors) == 1:
            return errors[0]
        tickets = [t for e in errors for t in getattr(e, "rejected_tickets", [])]
        err = WorkerError(f"{len(errors)} background failures: " + "; ".join(f"({i + 1}) {e}" for i, e in
                                                                         enumerate(errors)))
        err.errors = errors  # type: ignore[attr-defined]
        err.rejected_tickets = tickets  # type: ignore[attr-defined]
        err.__cause__ = errors[0]
        return err

    def raise_locked(self) -> None:
        err = self.take_locked()
        if err is not None:
            raise err


def combine_shutdown_errors(first: BaseException | None, later: BaseException | None) -> BaseException | None:
    """The one error ``close`` raises when its own flush failed (``first``) and the worker
    reported more while stopping (``later``): both reach the caller, nothing is dropped at
    shutdown either."""
    if first is None:
        return later
    if later is None:
        return first
    combined = WorkerError(f"close: {first}; and then: {later}")
    combined.errors = [first, later]  # type: ignore[attr-defined]
    combined.rejected_tickets = [*getattr(first, "rejected_tickets", []),  # type: ignore[attr-defined]
                                 *getattr(later, "rejected_tickets", [])]
    combined.__cause__ = first
    return combined
