"""Stores on object storage: a store URL (``s3://bucket/prefix/name.zarr``, ``gs://``, ``az://``) and its objects.

A store on object storage is a Zarr store whose every chunk is its own object,
read and written through ``obstore`` (the ``reservoir[cloud]`` extra). It
keeps the guarantees of a store on disk by object-store means:

- **one writer**: a lease object ``<name>.zarr.lease`` beside the store
  (:mod:`reservoir.store.lease`), created with a conditional write;
- **creation**: the store's attributes (its schema, key and checksums) are
  written last, so a store is readable only once its whole layout, projection
  and final norm are written; a half-created store is recognised (objects
  under the prefix, no attributes of ours) and rebuilt by the same command;
- **chunks**: checksums and repair work unchanged; a chunk object that is
  missing reads as zeros, which its checksum refuses.

Credentials, region and endpoint come the way ``obstore`` takes them: the
environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_ENDPOINT_URL``, ...; ``GOOGLE_*`` and ``AZURE_*`` for the others), the
instance's or the pod's identity, an AWS profile (``AWS_PROFILE`` or
``--storage-option profile=NAME``, read by boto3 when it is installed), plus
``--storage-option KEY=VALUE``
(:func:`configure`). An ``http://`` endpoint is allowed without further
options. Requests are retried with backoff, within bounds (:data:`RETRY`).
"""

from __future__ import annotations

import atexit
import gc
import os
import re
from datetime import timedelta
from typing import Any

from reservoir.errors import ReservoirError

#: ``scheme://``: what makes a store path a URL.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: Characters a store URL may not hold: what a URL parser decodes or cuts (``%``, ``?``, ``#``), a backslash,
#: whitespace and control characters. obstore places objects where the *parsed* URL points, so ``%2e%2e`` would
#: climb out of the prefix and two spellings of one place would take two leases.
_UNSAFE = re.compile(r"[%?#\\\s\x00-\x1f\x7f]")
#: Schemes of object stores (obstore's names).
SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "adl")
#: Retries of a failed request: backoff from 0.1 s doubling up to 5 s, at most 6 retries and 60 s in all.
RETRY = {"max_retries": 6, "retry_timeout": timedelta(seconds=60),
         "backoff": {"init_backoff": timedelta(seconds=0.1), "max_backoff": timedelta(seconds=5), "base": 2}}
#: A bucket's (or container's) name: what S3, GCS and Azure allow, and no user, password or port; ADLS Gen2's
#: ``abfs(s)://container@account.dfs.core.windows.net`` names its account after the container.
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_ADLS_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}@[A-Za-z0-9][A-Za-z0-9.-]{0,254}")
#: ``--storage-option`` keys that take a URL (checked before obstore's client, which panics on a bad one).
_URL_KEY = re.compile(r"(?:.*_)?(?:endpoint|endpoint_url)|proxy_url")
#: ``--storage-option`` keys that would put the objects in another bucket than the URL names (obstore's config).
_PLACE_KEYS = re.compile(r"(?:aws_|google_|azure_(?:storage_)?)?(?:bucket|bucket_name|container|container_name)")
#: ``--storage-option`` keys (any case) of an S3 endpoint, as obstore's config takes them.
_S3_ENDPOINT_KEYS = ("endpoint", "aws_endpoint", "aws_endpoint_url", "endpoint_url")
#: The environment variables of a scheme's credentials and settings that obstore reads.
_ENV_PREFIX = {"s3": "AWS_", "s3a": "AWS_", "gs": "GOOGLE_", "az": "AZURE_", "abfs": "AZURE_", "abfss": "AZURE_",
               "azure": "AZURE_", "adl": "AZURE_"}
#: The most retries and the longest retry budget ``--storage-option`` may ask for.
MAX_RETRIES, MAX_RETRY_SECONDS = 100, 24 * 3600.0
#: Keys of ``--storage-option`` that set the HTTP client.
_CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "connect_timeout", "timeout", "proxy_url", "user_agent",
                "pool_idle_timeout", "pool_max_idle_per_host", "http1_only", "http2_only")

_options: dict[str, str] = {}
_stores: dict[tuple, Any] = {}  # (url, options) -> obstore store, one client per place


@atexit.register
def _drop_stores() -> None:
    """Drop the object stores (and their HTTP clients) while the interpreter is whole, not during its teardown."""
    _stores.clear()
    gc.collect()


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, (str, StoreURL)) and _URL.match(str(path)) is not None


def configure(options: dict[str, str] | None) -> None:
    """Set the storage options every store URL of this process is opened with (``--storage-option``)."""
    _options.clear()
    _options.update(options or {})
    _stores.clear()


def parse_options(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs (``--storage-option``); one line for a pair without ``=``."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ReservoirError(f"--storage-option: expected KEY=VALUE (e.g. region=eu-west-1), found {pair!r}")
        if key.strip() in out:
            raise ReservoirError(f"--storage-option: expected each option once, found {key.strip()} twice")
        out[key.strip()] = value.strip()
    return out


def _obstore() -> Any:
    try:
        import obstore
        import obstore.store  # noqa: F401 - from_url
    except ImportError:
        raise ReservoirError("stores on object storage need the cloud extra: pip install 'reservoir[cloud]'") \
            from None
    return obstore


def request_failed(err: BaseException) -> bool:
    """Whether ``err`` (or what raised it) is an object store's request that failed (the service's refusal, a
    timeout, a connection lost), not a chunk that reads back wrong: a missing object reads as Zarr's fill value,
    so what a read of a store raises from obstore is the request."""
    base = _obstore().exceptions.BaseError
    seen: BaseException | None = err
    for _ in range(8):  # a short chain: Zarr's or asyncio's wrapping
        if seen is None:
            return False
        if isinstance(seen, base):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class StoreURL:
    """A store's place on object storage: ``s3://bucket/prefix/name.zarr`` (no trailing slash).

    Mimics the few parts of :class:`pathlib.Path` the store uses (``name``,
    ``suffix``, ``exists()``, ``str()``), and gives the object stores of the
    store's prefix (for Zarr) and of its bucket (for the lease beside it).
    """

    def __init__(self, url: str, options: dict[str, str] | None = None):
        m = _URL.match(url)
        shown = _no_userinfo(url)  # a password before '@' is not echoed
        if m is None:
            raise ReservoirError(f"expected a store URL like s3://bucket/prefix/name.zarr, found {shown!r}")
        scheme = m.group(1).lower()
        if scheme not in SCHEMES:
            raise ReservoirError(f"{shown}: expected an object store URL ({', '.join(s + '://' for s in SCHEMES[:4])}"
                                 f"...), found the scheme {scheme!r}")
        rest = url[m.end():].strip("/")
        bucket, _, key = rest.partition("/")
        if not bucket or not key or any(part in ("", ".", "..") for part in key.split("/")):
            raise ReservoirError(f"expected a store URL like {scheme}://bucket/prefix/name.zarr, found {shown!r}")
        bad = _UNSAFE.search(rest)
        if bad is not None:
            raise ReservoirError(f"expected a store URL without {bad.group()!r} (escapes, queries, fragments and "
                                 f"spaces are not taken), found {shown!r}")
        adls = scheme in ("abfs", "abfss") and _ADLS_BUCKET.fullmatch(bucket) is not None
        if not (_BUCKET.fullmatch(bucket) or adls):  # user:password@, :port: one place, two names
            before = bucket.partition("@")[0] if "@" in bucket else None
            if before is not None and (scheme not in ("abfs", "abfss") or ":" in before):  # the password not echoed
                raise ReservoirError(f"expected no user:password@ in a store URL (credentials go in the environment "
                                     f"or --storage-option); found one before {bucket.rsplit('@', 1)[1]!r}")
            raise ReservoirError(f"expected a bucket name of letters, digits, '.', '-' and '_' in a store URL; found "
                                 f"{bucket!r} in {scheme}://... (credentials and endpoints go in the environment or "
                                 "--storage-option)")
        self.scheme, self.bucket, self.key = scheme, bucket, key
        self.url = f"{scheme}://{bucket}/{key}"
        self.options = dict(_options if options is None else options)

    # -- Path-like ---------------------------------------------------------
    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"StoreURL({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoreURL) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        dot = self.name.rfind(".")
        return self.name[dot:] if dot > 0 else ""

    def child(self, name: str) -> StoreURL:
        """The URL of ``name`` inside this prefix (a recipe's store in its cache URL)."""
        return StoreURL(f"{self.url}/{name}", self.options)

    # -- the object stores ---------------------------------------------------
    def _store(self, prefix: str | None) -> Any:
        obstore = _obstore()
        from_url: Any = obstore.store.from_url  # (overloads per scheme; the options are checked by obstore)

        env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "GOOGLE_", "AZURE_"))))
        key = (self.scheme, self.bucket, prefix, tuple(sorted(self.options.items())), env)
        if key not in _stores:
            config: dict[str, Any] = {}
            client: dict[str, Any] = {}
            retry: dict[str, Any] = {**RETRY}
            for k, v in self.options.items():
                if _PLACE_KEYS.fullmatch(k.lower()):
                    raise ReservoirError(f"--storage-option {k}: expected the bucket as the store URL names it "
                                         f"({self.bucket}); found an option that would put the objects elsewhere")
                if k == "max_retries":
                    retry[k] = int(_number(k, v, 0, MAX_RETRIES))
                elif k == "retry_timeout":
                    retry[k] = timedelta(seconds=_number(k, v, 0, MAX_RETRY_SECONDS))
                elif k in _CLIENT_KEYS:
                    client[k] = v
                else:
                    config[k] = v
            for k, v in [*config.items(), *client.items()]:
                if isinstance(v, str):
                    _check_text(f"--storage-option {k}", v)
                if _URL_KEY.fullmatch(k.lower()) and "use_" not in k.lower():  # (use_fabric_endpoint: a flag)
                    _check_endpoint(f"--storage-option {k}", v)
            for k, v in env:  # obstore's client panics on a control character in what it puts in a header
                if k.startswith(_ENV_PREFIX.get(self.scheme, "AWS_")) and "SERVICE_ACCOUNT" not in k:
                    _check_text(k, v)
            endpoint = self._endpoint(config) if self.scheme in ("s3", "s3a") else None
            if endpoint is not None and endpoint.startswith("http://"):
                client.setdefault("allow_http", True)
            extra = {}
            profile = config.pop("profile", None) or os.environ.get("AWS_PROFILE")
            if profile and self.scheme in ("s3", "s3a"):
                extra["credential_provider"] = _profile_credentials(profile)
            base = f"{self.scheme}://{self.bucket}" + (f"/{prefix}" if prefix else "")
            try:
                _stores[key] = from_url(base, config=config or None, client_options=client or None,
                                        retry_config=retry, **extra)
            except obstore.exceptions.BaseError as err:
                raise ReservoirError(f"{self.url}: could not set up the object store ({cause(err)})") from None
        return _stores[key]

    def _endpoint(self, config: dict[str, Any]) -> str | None:
        """The S3 endpoint obstore will use, each spelling checked: ``AWS_ENDPOINT_URL_S3`` (which obstore reads
        over any option: one naming another endpoint is refused, not ignored), else the option, else
        ``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT``."""
        given = [(k, str(v)) for k, v in config.items() if k.lower() in _S3_ENDPOINT_KEYS]
        if len(given) > 1:
            raise ReservoirError(f"--storage-option: expected one endpoint; found {given[0][0]} and {given[1][0]}")
        s3_only = os.environ.get("AWS_ENDPOINT_URL_S3")
        if s3_only is not None:
            _check_endpoint("AWS_ENDPOINT_URL_S3", s3_only)
            if given and given[0][1].rstrip("/") != s3_only.rstrip("/"):
                raise ReservoirError(f"--storage-option {given[0][0]}: expected the endpoint obstore will use; found "
                                     f"AWS_ENDPOINT_URL_S3 set to {_no_userinfo(s3_only)!r}, which it reads over any "
                                     "option (unset it, or drop the option)")
            return s3_only
        if given:
            return given[0][1]
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
            if os.environ.get(k) is not None:
                _check_endpoint(k, os.environ[k])
        return os.environ.get("AWS_ENDPOINT_URL", os.environ.get("AWS_ENDPOINT"))

    @property
    def objects(self) -> Any:
        """The object store rooted at this store's prefix (keys relative to it)."""
        return self._store(self.key)

    @property
    def bucket_store(self) -> Any:
        """The object store of the whole bucket (the lease object is ``<key>.lease`` in it)."""
        return self._store(None)

    def zarr_store(self, read_only: bool) -> Any:
        """The Zarr store over this prefix."""
        import zarr.storage

        return zarr.storage.ObjectStore(self.objects, read_only=read_only)

    # -- what is there ---------------------------------------------------------
    def exists(self) -> bool:
        """Whether any object lies under the prefix (a store, or the start of one)."""
        obstore = _obstore()
        try:
            for batch in obstore.list(self.objects, chunk_size=1):
                return len(batch) > 0
            return False
        except obstore.exceptions.BaseError as err:
            raise ReservoirError(f"{self.url}: could not list the store's objects ({cause(err)})") from None

    def has_metadata(self) -> bool:
        """Whether the store's root metadata object (``zarr.json``) exists."""
        obstore = _obstore()
        try:
            obstore.head(self.objects, "zarr.json")
            return True
        except FileNotFoundError:
            return False
        except obstore.exceptions.BaseError as err:
            raise ReservoirError(f"{self.url}: could not read the store's metadata ({cause(err)})") from None

    def check_outside_stores(self) -> None:
        """Refuse (one line) a store URL inside another store's prefix (:meth:`store_around`), and say now, before
        any work, when the bucket cannot be listed (missing, or the credentials refused)."""
        self.exists()
        around = self.store_around()
        if around is not None:  # as a folder inside a Zarr store on disk is refused
            raise ReservoirError(f"{self.url}: expected a store URL outside any other store; found it inside the "
                                 f"store {around}, whose objects a store never joins; pass another --out")

    def store_around(self) -> StoreURL | None:
        """The outermost store (a prefix holding a ``zarr.json``) this URL lies inside, or ``None``: a store is
        never written into another's objects (whose rebuild would delete it)."""
        obstore = _obstore()
        parts = self.key.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            try:
                obstore.head(self.bucket_store, f"{prefix}/zarr.json")
            except (FileNotFoundError, obstore.exceptions.PermissionDeniedError):
                continue  # none, or none this identity may read (S3 answers 403 above a prefix a policy grants)
            except obstore.exceptions.BaseError as err:
                raise ReservoirError(f"{self.url}: could not read the objects above it ({cause(err)})") from None
            return StoreURL(f"{self.scheme}://{self.bucket}/{prefix}", self.options)
        return None

    def check_metadata(self, max_bytes: int) -> bool:
        """Whether any object lies under the prefix, refusing (one line) a metadata object (``zarr.json``) over
        ``max_bytes``, before Zarr reads it whole: as a store on disk is checked."""
        obstore = _obstore()
        found = False
        try:
            for batch in obstore.list(self.objects, chunk_size=1000):
                found = found or len(batch) > 0
                for meta in batch:
                    if meta["path"].rsplit("/", 1)[-1] == "zarr.json" and meta["size"] > max_bytes:
                        raise ReservoirError(f"{self.url}: expected a store whose metadata objects are at most "
                                             f"{max_bytes:,} bytes; found {meta['path']} of {meta['size']:,} bytes")
        except obstore.exceptions.BaseError as err:
            raise ReservoirError(f"{self.url}: could not list the store's objects ({cause(err)})") from None
        return found

    def delete_all(self) -> None:
        """Delete every object under the prefix (the lease beside it stays); refused (nothing deleted) when the
        prefix holds another store (a name ending ``.zarr`` among its keys), which no store of ours contains."""
        obstore = _obstore()
        try:
            batches = [[meta["path"] for meta in batch] for batch in obstore.list(self.objects, chunk_size=1000)]
            nested = next((p for b in batches for p in b if any(part.lower().endswith(".zarr")
                                                                 for part in p.split("/")[:-1])), None)
            if nested is not None:
                raise ReservoirError(f"{self.url}: expected only this store's objects under its prefix; found "
                                     f"{nested}, another store's: nothing deleted, pass another --out")
            for paths in batches:
                if paths:
                    obstore.delete(self.objects, paths)
        except FileNotFoundError:
            pass
        except obstore.exceptions.BaseError as err:
            raise ReservoirError(f"{self.url}: could not delete the store's objects ({cause(err)})") from None


def _profile_credentials(profile: str) -> Any:
    """Credentials of an AWS profile (``AWS_PROFILE`` or ``--storage-option profile=NAME``), read by boto3 from
    ``~/.aws/config`` and ``~/.aws/credentials`` (or ``AWS_CONFIG_FILE``, ``AWS_SHARED_CREDENTIALS_FILE``)."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise ReservoirError(f"AWS profile {profile!r}: reading profiles needs boto3 (pip install boto3), or give "
                             "credentials in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)") from None
    try:
        return Boto3CredentialProvider(boto3.Session(profile_name=profile))
    except Exception as err:  # noqa: BLE001 - botocore's ProfileNotFound and configuration errors
        raise ReservoirError(f"AWS profile {profile!r}: {cause(err)}") from None


def _number(key: str, value: str, lo: float, hi: float) -> float:
    """A ``--storage-option`` number in ``lo..hi`` (finite)."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not lo <= number <= hi:  # NaN too
        raise ReservoirError(f"--storage-option {key}: expected a number in {lo:g}..{hi:g}, found {value!r}")
    return number


def _check_endpoint(where: str, value: str) -> None:
    """Refuse (one line) an endpoint that is not an ``http(s)://host[:port][/path]`` URL: obstore's client
    panics on one, out of any error handling."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        _ = parts.port  # a port that is not a number, or out of range: ValueError
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not (parts.query or parts.fragment)
        userinfo = "@" in parts.netloc
    except ValueError:
        ok, userinfo = False, "@" in value
    if userinfo:  # a password in the URL would be echoed by every error line naming a request
        raise ReservoirError(f"{where}: expected an endpoint URL without user:password@ (credentials go in the "
                             f"environment or a profile); found {_no_userinfo(value)!r}")
    if not ok or _UNSAFE.search(value):
        raise ReservoirError(f"{where}: expected an endpoint URL like https://host:port; found {value!r}")


def _check_text(where: str, value: str) -> None:
    """Refuse (one line, the value not echoed: it may be a secret) a setting holding a control character, such as
    the line break a secret read from a file keeps: obstore's client panics on one in a header."""
    bad = next((i for i, c in enumerate(value) if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ReservoirError(f"{where}: expected a value without control characters (a line break copied with a "
                             f"secret?); found {value[bad]!r} at character {bad + 1} of {len(value)}")


def _no_userinfo(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it left out."""
    return re.sub(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@", r"\1", text)


def cause(err: BaseException) -> str:
    """An object-store error in one line: its first line, request timings dropped, and the service's own code and
    message when the response carried them (``<Code>NoSuchBucket</Code>``, which the first line leaves out)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = _no_userinfo(re.sub(r" in [0-9.]+\s*(?:ns|µs|us|ms|s)\b", "", text).strip())
    said = [m.group(1).strip() for tag in ("Code", "Message")
            if (m := re.search(rf"<{tag}>([^<]{{1,300}})</{tag}>", str(err))) is not None]
    if said:
        text = re.sub(r":?\s*<\?xml[^>]*>\s*$", "", text).rstrip(": ") + ": " + ": ".join(said)
    return text
