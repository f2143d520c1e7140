"""One writer per store on object storage: a lease object beside the store, renewed while its holder writes.

The lease is ``<store>.lease`` (``s3://bucket/x.zarr.lease`` for
``s3://bucket/x.zarr``), a small JSON object: the holder (host, pid, job,
start time) and when the lease expires. Every change to it is a conditional
write, so two writers can never both hold it:

- **taking** it is a create-if-absent (``If-None-Match: *``); a second writer
  finds it there and is refused in one line naming the holder;
- an **expired** lease (its holder died without releasing it: its time ran
  out, or its holder is a process of this host that no longer exists) is taken over
  with a replace conditional on the version read (its ETag and, where the
  store keeps one, its version: ``If-Match`` on S3 and Azure, the object's
  generation on GCS): of two takers, one replaces it, the other is refused;
- the holder **renews** it (conditional on its own last version) every quarter
  of its time to live, on a background thread; a holder that finds its lease
  replaced, or cannot renew it before it expires, stops writing at its next
  chunk with one line. Only an expiry the store confirmed (a renewal that
  succeeded) counts: a holder whose renewals fail stops once the last
  confirmed expiry, less a quarter of the time to live, has passed, before a
  second writer can take the lease;
- **releasing** deletes it.

Before writing, the taker checks that the backend honours conditional writes
(a second create-if-absent of the lease it holds must be refused): a backend
that ignores them could let two writers in, so the write is refused in one line
instead. The time to live is ``RESERVOIR_LEASE_SECONDS`` (default 60 s); the
holders' clocks must agree to well within it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from datetime import datetime, timezone
from typing import Any

from reservoir.errors import ReservoirError
from reservoir.io import env_seconds, process_alive
from reservoir.store.remote import StoreURL, _obstore, cause

ENV_SECONDS = "RESERVOIR_LEASE_SECONDS"
DEFAULT_SECONDS = 60.0


#: The most bytes of a lease object read (a record is a few hundred): a larger object counts as garbled.
MAX_RECORD_BYTES = 64 << 10


def ttl() -> float:
    """The lease's time to live in seconds (``RESERVOIR_LEASE_SECONDS``)."""
    return env_seconds(ENV_SECONDS, DEFAULT_SECONDS)


def lease_key(url: StoreURL) -> str:
    return f"{url.key}.lease"


def version_of(meta: Any) -> dict[str, str] | None:
    """What a conditional update of an object names (``{"e_tag", "version"}``) from its metadata or a put's result;
    ``None`` when the store gave neither. S3 and Azure compare the ETag, GCS the version (the generation)."""
    found = {k: meta[k] for k in ("e_tag", "version") if meta.get(k)}  # obstore takes no None in an update
    return found or None


def same_version(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two versions (:func:`version_of`) name one write of the object: by ETag where both give one."""
    key = "e_tag" if a.get("e_tag") and b.get("e_tag") else "version"
    return a.get(key) is not None and a.get(key) == b.get(key)


def read(url: StoreURL) -> tuple[dict | None, dict[str, str] | None]:
    """The lease's record and version (:func:`version_of`), or ``(None, None)`` when there is none."""
    obstore = _obstore()
    try:  # a record is a few hundred bytes: a larger object is garbled, and not read
        meta = obstore.head(url.bucket_store, lease_key(url))
        if meta["size"] > MAX_RECORD_BYTES:
            return {}, version_of(meta)
        got = obstore.get(url.bucket_store, lease_key(url))
        raw, ver = bytes(got.bytes()), version_of(got.meta)
    except FileNotFoundError:
        return None, None
    except obstore.exceptions.BaseError as err:
        raise ReservoirError(f"{url}: could not read its lease ({cause(err)})") from None
    try:
        record = json.loads(raw.decode()) if len(raw) <= MAX_RECORD_BYTES else None  # grown since the head
    except (UnicodeDecodeError, ValueError, RecursionError):
        record = None
    return (record if isinstance(record, dict) else {}), ver


def process_space() -> str | None:
    """Where this process's pid means something: the boot and the PID namespace (``<boot id>/pid:[<inode>]``), or
    ``None`` where the system does not say (not Linux). Containers that share a host name but not a PID namespace
    have different spaces."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def expired(record: dict | None) -> bool:
    """Whether a lease record has run out, or its holder is a process of this host that is gone (a record that
    says nothing readable counts as run out).

    "Of this host" means the same host name and, when the record says, the same
    boot and PID namespace (:func:`process_space`): a holder in another container
    of the same host name is not judged by this container's process table.
    """
    if not record:
        return True
    try:
        expires = float(record["expires"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return True
    if not math.isfinite(expires) or expires < time.time():  # NaN and infinity say nothing readable
        return True
    if record.get("host") != socket.gethostname():
        return False
    space = record.get("space")
    if space is not None and space != process_space():
        return False
    return not process_alive(record.get("pid"))


def describe(holder: dict | None) -> str:
    """``pid 123 on host-a since 2026-01-01T10:00:00+00:00`` (or what is known of it; a lease adds its job)."""
    if not holder:
        return "a process that has not yet recorded itself"
    job = f" (job {holder['job']})" if holder.get("job") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{job} since {holder.get('started')}"


def busy(where: Any, holder: dict | None) -> ReservoirError:
    """The refusal of a second writer: ``<where> is being written by <holder>; wait for it to finish or pass another
    --out``."""
    return ReservoirError(f"{where} is being written by {describe(holder)}; wait for it to finish or pass another "
                          "--out")


def holder(url: StoreURL) -> dict | None:
    """Who holds the lease of the store at ``url`` (``{pid, host, started, ...}``), or ``None`` when nobody does."""
    record, _ = read(url)
    return None if expired(record) else record


class Lease:
    """The write lease of one store on object storage; :meth:`acquire` refuses in one line when it is held."""

    def __init__(self, url: StoreURL, job: str | None = None):
        self.url, self.key, self.job = url, lease_key(url), job
        self.ttl = ttl()
        self._version: dict[str, str] | None = None  # of the lease as this holder last wrote it
        self._record: dict[str, Any] = {}  # the holder, without its expiry
        self._expires = 0.0  # the expiry of the last version the store accepted
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()
        self._attempt: tuple[dict[str, Any] | None, float] = (None, 0.0)  # the last lease written, and its expiry

    def _put(self, obstore: Any, store: Any, mode: Any) -> None:
        """Write the lease with a new expiry (conditional on ``mode``); it is ours only once the write succeeded."""
        expires = time.time() + self.ttl  # taken before the write: the store's copy expires no earlier
        body = json.dumps({**self._record, "expires": expires}).encode()
        self._attempt = (json.loads(body), expires)
        self._version = version_of(obstore.put(store, self.key, body, mode=mode))
        self._expires = expires

    def _adopt(self) -> bool:
        """After a conditional write was refused: whether the lease the store holds is exactly the one that write
        sent (a response lost after the store applied it, and the client's retry refused: our own write), and if
        so, take its version as ours."""
        try:
            record, ver = read(self.url)
        except ReservoirError:
            return False
        sent, expires = self._attempt
        if sent is None or record != sent or ver is None:
            return False
        self._version, self._expires = ver, expires
        return True

    def _run_out(self) -> bool:
        """Whether the last confirmed expiry, less a quarter of the time to live, has passed."""
        return time.time() > self._expires - self.ttl / 4

    def acquire(self) -> Lease:
        obstore = _obstore()
        self._record = {"pid": os.getpid(), "host": socket.gethostname(), "job": self.job,
                        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "space": process_space()}
        store = self.url.bucket_store
        try:
            try:
                self._put(obstore, store, "create")
            except (FileExistsError, obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError):
                if not self._adopt() and not self._take_over(obstore, store):  # (adopted: our create applied)
                    return self.acquire()  # released between our create and our read: again from the start
            self._check_conditional(obstore, store)
            if self._version is None:  # a lease that cannot be renewed conditionally cannot be held
                obstore.delete(store, self.key)
                raise ReservoirError(f"{self.url}: the object store gives its objects no version (ETag), so a "
                                     "single writer cannot be guaranteed; refusing to write")
        except ReservoirError:
            raise
        except obstore.exceptions.BaseError as err:
            raise ReservoirError(f"{self.url}: could not take the store's write lease {self.key} "
                                 f"({cause(err)})") from None
        self._thread = threading.Thread(target=self._renew_loop, name="reservoir-lease", daemon=True)
        self._thread.start()
        return self

    def _take_over(self, obstore: Any, store: Any) -> bool:
        """Take over the lease another writer holds once it has expired (refusing, one line, while it has not);
        ``False`` when it was released meanwhile (take it from the start)."""
        record, ver = read(self.url)
        if record is None:
            return False
        if not expired(record):
            raise busy(self.url, record) from None
        if ver is None:
            raise ReservoirError(f"{self.url}: the object store gives its objects no version (ETag), so an expired "
                                 "lease cannot be taken over by exactly one writer; refusing to write (delete "
                                 f"{self.key} if its holder is gone)")
        try:  # an expired lease: replace exactly the version read, so one taker wins
            self._put(obstore, store, ver)
        except (obstore.exceptions.PreconditionError, FileExistsError, FileNotFoundError):
            if not self._adopt():  # (adopted: our replacement applied, its response lost)
                now, _ = read(self.url)
                raise ReservoirError(f"{self.url} is being written by {describe(now)} (it took over the expired "
                                     "lease first); wait for it to finish or pass another --out") from None
        return True

    def _check_conditional(self, obstore: Any, store: Any) -> None:
        """Refuse a backend that ignores create-if-absent (a second create of the held lease must fail)."""
        try:  # when it succeeds it replaced our lease: the new version is ours to delete
            self._put(obstore, store, "create")
        except (FileExistsError, obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError):
            return
        except obstore.exceptions.NotSupportedError:
            pass
        self.release()
        raise ReservoirError(f"{self.url}: the object store does not honour conditional writes (If-None-Match), so "
                             "a single writer cannot be guaranteed; refusing to write")

    def _renew_loop(self) -> None:
        obstore = _obstore()
        while not self._stop.wait(self.ttl / 4):
            with self._mutex:
                if self._version is None or self._lost is not None:
                    return
                try:
                    self._put(obstore, self.url.bucket_store, self._version)
                except (obstore.exceptions.PreconditionError, FileNotFoundError, FileExistsError):
                    if self._adopt():  # our renewal applied, its response lost
                        continue
                    self._lost = self._taker()
                    return
                except obstore.exceptions.BaseError as err:
                    if self._run_out():
                        self._lost = f"it could not be renewed before it expired ({cause(err)})"
                        return

    def _taker(self) -> str:
        """Why a renewal was refused, naming who holds the lease now where the store says."""
        try:
            now, _ = read(self.url)
        except ReservoirError:
            now = None
        if now is None:
            return "another writer has taken it over, or it was deleted"
        return f"another writer has taken it over: {describe(now)}"

    def check(self) -> None:
        """Refuse to write once the lease is lost (replaced by another writer, or not renewed in time).

        Past the last confirmed expiry (less a quarter of the time to live) the
        lease counts as lost even before the renewing thread says so: a renewal
        that keeps failing, or a thread that never got to run, cannot stretch it.
        """
        if self._lost is None and self._version is not None and self._run_out():  # a renewal in flight: not yet ours
            self._lost = "it could not be renewed before it expired"
        if self._lost is not None:
            raise ReservoirError(f"{self.url}: this process lost the store's write lease ({self._lost}); stopping, "
                                 "finished chunks are kept: rerun the same command to resume")

    def release(self) -> None:
        """Stop renewing and delete the lease (if it is still ours)."""
        obstore = _obstore()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._mutex:
            mine, self._version = self._version, None
        if mine is None or self._lost is not None or self._run_out():
            return  # not ours for certain any more: another writer may take it (it expires on its own)
        try:
            _, now = read(self.url)
            if now is not None and same_version(now, mine):
                obstore.delete(self.url.bucket_store, self.key)
        except (ReservoirError, obstore.exceptions.BaseError):
            pass  # it expires on its own

    @property
    def record(self) -> dict[str, Any]:
        """Who holds this lease as its record says (``{pid, host, job, started}``; its expiry left out)."""
        return dict(self._record)

    @property
    def held(self) -> bool:
        return self._version is not None and self._lost is None and not self._run_out()

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
