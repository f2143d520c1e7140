"""Stores on object storage, against a real S3 API: moto's server on 127.0.0.1 (a free port), started here.

The server honours conditional writes (``If-None-Match: *``, ``If-Match``),
as S3 does. Every store here is written by the real commands (in-process
through click, or as subprocesses that are killed, raced and cut off from the
server) and compared, array by array, with the same extraction on local disk.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")
moto_server = pytest.importorskip("moto.server")

from reservoir.errors import ReservoirError  # noqa: E402
from reservoir.store import FeatureStore, WritableStore, remote  # noqa: E402
from reservoir.store import lease as leases  # noqa: E402
from test_cli import assert_bad_input, assert_ok, invoke  # noqa: E402
from test_distributed import ARGS, arrays, assert_identical, torchrun  # noqa: E402

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
# float32 tiny-gpt2 as in test_distributed: 5 train chunks, 1 test chunk
SMALL = ["extract", "--task", "bit-xor", "-p", "n_train=3000", "-p", "n_test=500", "--backbone", "tiny-gpt2",
         "--layers", "2", "--dtype", "float32", "--device", "cpu", "--quiet"]  # fmt: skip


def start_server(port: int = 0):
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server


@pytest.fixture(scope="module")
def server():
    srv = start_server()
    host, port = srv.get_host_and_port()
    yield f"http://{host}:{port}"
    srv.stop()


@pytest.fixture
def bucket(server, monkeypatch) -> str:
    """A new bucket on the server; the environment points every store URL (and subprocess) at the server."""
    import boto3

    for k, v in {**CREDENTIALS, "AWS_ENDPOINT_URL": server}.items():
        monkeypatch.setenv(k, v)
    name = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=server).create_bucket(Bucket=name)
    remote.configure(None)
    yield name
    remote.configure(None)


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> dict[str, Path]:
    """The same extractions on local disk (the reference every URL store must equal)."""
    folder = tmp_path_factory.mktemp("local")
    out = {"small": folder / "small.zarr", "args": folder / "args.zarr"}
    assert_ok(invoke(*SMALL, "--out", out["small"]))
    assert_ok(invoke(*ARGS, "--out", out["args"]))
    return out


def objects(url: str) -> list[str]:
    import obstore

    store = remote.StoreURL(url).objects
    return [m["path"] for batch in obstore.list(store) for m in batch]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


# ------------------------------------------------------------------ the commands on a URL
def test_extract_info_fit_linear_on_a_url_equal_local(bucket, local, tmp_path):
    url = f"s3://{bucket}/stores/x.zarr"
    out = invoke(*SMALL, "--out", url)
    assert_ok(out)
    assert f"wrote {url} (zarr)" in out.output
    assert not Path("s3:").exists()  # nothing local named after the URL
    assert_identical(url, local["small"])
    info = invoke("info", url, "--verify")
    assert_ok(info)
    assert "written chunks match their checksums" in info.output and "3/3 fixed arrays" in info.output
    fit = invoke("fit-linear", url, "--layer", "all", "--results", tmp_path / "r")
    ref = invoke("fit-linear", local["small"], "--layer", "all", "--results", tmp_path / "l")
    assert_ok(fit), assert_ok(ref)
    table = [ln.split()[:4] for ln in fit.output.splitlines() if ln[:5].strip().isdigit()]
    assert table and table == [ln.split()[:4] for ln in ref.output.splitlines() if ln[:5].strip().isdigit()]
    assert not any(k.endswith(".lease") for k in objects(f"s3://{bucket}/stores"))  # the lease is released


def test_python_api_and_rerun_of_a_complete_store(bucket, local):
    from reservoir import extract, get_task, load_backbone

    task = get_task("bit-xor", n_train=3000, n_test=500)
    url = f"s3://{bucket}/api.zarr"
    with extract(task, load_backbone("tiny-gpt2", d_in=task.d_in), url, layers=2, dtype="float32", device="cpu",
                 progress=False) as store:
        assert isinstance(store.path, remote.StoreURL) and store.complete
    assert_identical(url, local["small"])
    assert_ok(invoke(*SMALL, "--out", url))  # complete: nothing to do, nothing changed
    assert_identical(url, local["small"])


def test_bad_urls_and_hdf5_are_refused_in_one_line(bucket, monkeypatch):
    assert_bad_input(r := invoke(*SMALL, "--out", f"s3://{bucket}/x.h5"))
    assert "HDF5 stores stay on a local filesystem" in r.stderr
    assert_bad_input(r := invoke(*SMALL, "--out", f"s3://{bucket}/x.zarr", "--format", "hdf5"))
    assert_bad_input(r := invoke(*SMALL, "--out", "ftp://host/x.zarr"))
    assert "expected an object store URL" in r.stderr
    assert_bad_input(r := invoke(*SMALL, "--out", "memory://bkt/x.zarr"))  # not a place another process can see
    assert "memory://bkt/x.zarr: expected an object store URL (s3://, s3a://, gs://, az://...), found the scheme " \
           "'memory'" in r.stderr
    assert_bad_input(r := invoke("info", f"s3://{bucket}/nothing.zarr"))
    assert "found no such file or folder (no object under that prefix)" in r.stderr
    assert_bad_input(r := invoke("info", "s3://no-such-bucket-here/x.zarr"))
    assert "s3://no-such-bucket-here/x.zarr" in r.stderr
    assert_bad_input(r := invoke("info", f"s3://{bucket}/x.zarr", "--storage-option", "novalue"))
    assert "expected KEY=VALUE" in r.stderr
    monkeypatch.setitem(sys.modules, "obstore", None)
    assert_bad_input(r := invoke("info", f"s3://{bucket}/x.zarr"))
    assert "pip install 'reservoir[cloud]'" in r.stderr


def test_foreign_objects_are_never_taken_for_a_store_nor_deleted(bucket):
    import obstore

    url = f"s3://{bucket}/theirs.zarr"
    obstore.put(remote.StoreURL(url).objects, "data.bin", b"someone else's")
    assert_bad_input(r := invoke(*SMALL, "--out", url))
    assert "expected a reservoir feature store or an empty prefix, found other objects there" in r.stderr
    assert objects(url) == ["data.bin"]


def test_a_store_inside_another_stores_prefix_is_refused_and_a_rebuild_never_deletes_one(bucket, local, tmp_path):
    """A store URL under another store (complete or half-built) is refused, as a folder inside a Zarr store on disk
    is; a half-built store whose prefix holds another store's objects is not rebuilt over them."""
    import obstore

    outer = f"s3://{bucket}/a.zarr"
    assert_ok(invoke(*SMALL, "--out", outer))
    for inner in (f"{outer}/train/x.zarr", f"{outer}/sub/deeper/x.zarr"):
        assert_bad_input(r := invoke(*SMALL, "--out", inner))
        assert f"{inner}: expected a store URL outside any other store; found it inside the store {outer}" in r.stderr
    assert not [p for p in objects(outer) if "x.zarr" in p]
    assert_identical(outer, local["small"])  # the outer store untouched, no lease written into it

    half = remote.StoreURL(f"s3://{bucket}/p.zarr")  # a creation stopped before its attributes ...
    obstore.put(half.objects, "zarr.json", json.dumps({"zarr_format": 3, "node_type": "group",
                                                        "attributes": {"reservoir": "building"}}).encode())
    obstore.put(half.objects, "sub/x.zarr/zarr.json", b"{}")  # ... with another store copied in by hand
    with pytest.raises(ReservoirError, match="found sub/x.zarr/zarr.json, another store's: nothing deleted"):
        half.delete_all()
    assert_bad_input(r := invoke(*SMALL, "--out", str(half)))
    assert "sub/x.zarr/zarr.json" in objects(str(half))


def test_storage_options_and_endpoints_that_would_panic_or_move_the_objects_are_one_line(bucket, monkeypatch):
    url = f"s3://{bucket}/a.zarr"
    cases = {("bucket=other",): "--storage-option bucket: expected the bucket as the store URL names it",
             ("aws_bucket_name=other",): "--storage-option aws_bucket_name: expected the bucket",
             ("max_retries=-1",): "--storage-option max_retries: expected a number in 0..100, found '-1'",
             ("max_retries=1e30",): "expected a number in 0..100, found '1e30'",
             ("retry_timeout=nan",): "--storage-option retry_timeout: expected a number in 0..86400, found 'nan'",
             ("retry_timeout=-5",): "expected a number in 0..86400, found '-5'",
             ("endpoint=notaurl",): "--storage-option endpoint: expected an endpoint URL like https://host:port; "
                                    "found 'notaurl'",
             ("endpoint=http://127.0.0.1:99999",): "found 'http://127.0.0.1:99999'"}
    for options, message in cases.items():
        assert_bad_input(r := invoke("info", url, *[a for o in options for a in ("--storage-option", o)]))
        assert message in r.stderr, (options, r.stderr)
    server = os.environ["AWS_ENDPOINT_URL"]
    for bad in (server + " ", "notaurl"):  # obstore's client panicked on both (a Rust panic, exit 1)
        monkeypatch.setenv("AWS_ENDPOINT_URL", bad)
        remote.configure(None)
        assert_bad_input(r := invoke("info", url))
        assert f"AWS_ENDPOINT_URL: expected an endpoint URL like https://host:port; found {bad!r}" in r.stderr
    assert_bad_input(r := invoke("info", url, "--storage-option", f"endpoint={server}"))  # the option overrides it
    assert "found no such file or folder (no object under that prefix)" in r.stderr


def test_settings_obstore_would_panic_on_or_quietly_override_are_one_line(bucket, monkeypatch):
    """A secret with a line break (read from a file) made obstore's client panic (a Rust panic, exit 1); an
    AWS_ENDPOINT_URL_S3 won over --storage-option endpoint=; a password in an endpoint was echoed by every line."""
    url, server = f"s3://{bucket}/a.zarr", os.environ["AWS_ENDPOINT_URL"]
    for k in ("AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ACCESS_KEY_ID"):
        with monkeypatch.context() as m:
            m.setenv(k, os.environ.get(k, "x") + "\n")
            remote.configure(None)
            assert_bad_input(r := invoke("info", url))
            assert f"{k}: expected a value without control characters (a line break copied with a secret?); " \
                   "found '\\n' at character" in r.stderr
    assert_bad_input(r := invoke("info", url, "--storage-option", "region=us\x01east"))
    assert "--storage-option region: expected a value without control characters" in r.stderr
    with monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
        remote.configure(None)
        assert_bad_input(r := invoke("info", url, "--storage-option", f"endpoint={server}"))
        assert "--storage-option endpoint: expected the endpoint obstore will use; found AWS_ENDPOINT_URL_S3 set " \
               "to 'http://127.0.0.1:1', which it reads over any option" in r.stderr
    for option in (f"endpoint_url={server}", f"aws_endpoint_url={server}"):  # http allowed whichever the spelling
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        remote.configure(None)
        assert_bad_input(r := invoke("info", url, "--storage-option", option))
        assert "found no such file or folder (no object under that prefix)" in r.stderr, r.stderr
    for where in ("env", "option"):
        secret = "http://user:SECRETPW@127.0.0.1:1"
        monkeypatch.setenv("AWS_ENDPOINT_URL", secret if where == "env" else server)
        remote.configure(None)
        r = invoke("info", url, *(["--storage-option", f"endpoint={secret}"] if where == "option" else []))
        assert_bad_input(r)
        assert "expected an endpoint URL without user:password@" in r.stderr and "SECRETPW" not in r.stderr
    assert remote.cause(ValueError("Error performing GET http://u:SECRETPW@host:1/b?x in 3ms")) == \
        "Error performing GET http://host:1/b?x"


def test_the_services_own_code_and_message_are_in_the_line(bucket):
    assert_bad_input(r := invoke("info", "s3://no-such-bucket-here/x.zarr"))
    assert "404 Not Found: NoSuchBucket: The specified bucket does not exist" in r.stderr
    assert "<?xml" not in r.stderr
    assert_bad_input(r := invoke(*SMALL, "--out", "s3://no-such-bucket-here/x.zarr"))  # before the model loads
    assert "NoSuchBucket" in r.stderr and "tiny-gpt2" not in r.stdout


def test_a_bucket_name_with_credentials_or_a_port_is_refused():
    for bad in ("bucket:80", "-bucket"):
        with pytest.raises(ReservoirError, match=f"expected a bucket name of letters, digits.*found {bad!r}"):
            remote.StoreURL(f"s3://{bad}/a.zarr")
    with pytest.raises(ReservoirError, match=r"^expected no user:password@ in a store URL \(credentials go in the "
                                             r"environment or --storage-option\); found one before 'bucket'$"):
        remote.StoreURL("s3://user:SECRETPW@bucket/a.zarr")  # the password not echoed
    # ADLS Gen2's own form names the account after the container: taken, as obstore takes it
    assert remote.StoreURL("abfss://cont@acct.dfs.core.windows.net/pre/x.zarr").bucket == \
        "cont@acct.dfs.core.windows.net"
    with pytest.raises(ReservoirError, match="expected a bucket name"):
        remote.StoreURL("abfss://cont@acct.dfs.core.windows.net:443/pre/x.zarr")
    # a flag whose name holds "endpoint" is no endpoint URL
    remote.StoreURL("az://cont/pre/x.zarr", {"use_fabric_endpoint": "true", "account_name": "acct"}).objects


def test_oversized_lease_and_metadata_objects_are_not_read_whole(bucket, local):
    import obstore

    url = f"s3://{bucket}/a.zarr"
    assert_ok(invoke(*SMALL, "--out", url))
    u = remote.StoreURL(url)
    big = b'{"pid": 1, "host": "elsewhere", "started": "x", "expires": 1e300, "pad": "' + b"x" * (1 << 20) + b'"}'
    obstore.put(u.bucket_store, leases.lease_key(u), big)
    real_get = obstore.get
    fetched = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(obstore, "get", lambda *a, **k: fetched.append(a[1]) or real_get(*a, **k))
        record, version = leases.read(u)
    assert record == {} and version is not None and leases.lease_key(u) not in fetched  # garbled, never fetched
    assert leases.expired(record)
    for expires in ("NaN", "Infinity"):  # never running out was the old reading of both
        assert leases.expired(json.loads(f'{{"pid": 1, "host": "elsewhere", "expires": {expires}}}'))
    obstore.delete(u.bucket_store, leases.lease_key(u))
    meta = json.loads(bytes(obstore.get(u.objects, "zarr.json").bytes()))
    meta["attributes"]["pad"] = "x" * (65 << 20)
    obstore.put(u.objects, "zarr.json", json.dumps(meta).encode())
    assert_bad_input(r := invoke("info", url))
    assert "expected a store whose metadata objects are at most 67,108,864 bytes; found zarr.json of" in r.stderr


def test_outputs_and_data_given_as_urls_are_refused_not_written_to_a_local_s3_folder(bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"s3://{bucket}/a.zarr"
    assert_ok(invoke(*SMALL, "--out", url))
    for args in (("fit-linear", url, "--layer", "1", "--results", f"s3://{bucket}/results"),
                 ("fit-raw", "--task", "digits", "--out", f"s3://{bucket}/raw.json"),
                 ("train", "--from-store", url, "--steps", "1", "--out", f"s3://{bucket}/run"),
                 ("recipe", "run", "quickstart", "--out", f"s3://{bucket}/r"),
                 ("plot", "attention", "--run", "r", "--out", f"s3://{bucket}/fig.png"),
                 ("extract", "--task", "mnist", "-p", f"data_dir=s3://{bucket}/m", "--download", "--backbone",
                  "tiny-gpt2", "--out", str(tmp_path / "m.zarr")),
                 ("fit-raw", "--data", f"s3://{bucket}/x.csv")):
        assert_bad_input(r := invoke(*args))
        assert "on this machine's filesystem; found a URL (only feature stores are read and written on object " \
               "storage)" in r.stderr, (args, r.stderr)
    assert list(tmp_path.iterdir()) == []  # no folder named s3:


# ------------------------------------------------------------------ creation without rename
def test_half_created_store_is_refused_to_readers_and_rebuilt(bucket, local):
    import obstore

    url = f"s3://{bucket}/half.zarr"
    assert_ok(invoke(*SMALL, "--out", url))
    store = remote.StoreURL(url).objects
    meta = json.loads(bytes(obstore.get(store, "zarr.json").bytes()))
    meta["attributes"] = {"reservoir": "building"}  # as a creation stopped before its attributes leaves it
    obstore.put(store, "zarr.json", json.dumps(meta).encode())
    assert_bad_input(r := invoke("info", url))
    assert "is incomplete (its creation was interrupted); rerun the same `reservoir extract` command" in r.stderr
    assert_ok(invoke(*SMALL, "--out", url))
    assert_identical(url, local["small"])


# ------------------------------------------------------------------ damage
def test_deleted_and_corrupted_chunk_objects_are_found_and_repaired(bucket, local):
    import obstore

    url = f"s3://{bucket}/damaged.zarr"
    assert_ok(invoke(*SMALL, "--out", url))
    store = remote.StoreURL(url).objects
    chunks = sorted(k for k in objects(url) if k.startswith("train/features/c/"))
    obstore.delete(store, chunks[0])  # a missing object reads as zeros: its checksum must refuse it
    raw = bytearray(bytes(obstore.get(store, chunks[1]).bytes()))
    raw[100] ^= 0xFF
    obstore.put(store, chunks[1], bytes(raw))
    assert_bad_input(r := invoke("info", url, "--verify"))
    assert "2 damaged chunk(s)" in r.stderr
    with pytest.raises(ReservoirError, match="does not match its checksum"):
        with FeatureStore.open(url) as st:
            np.asarray(st.features("train")[:])
    assert_ok(invoke(*SMALL, "--out", url))  # the same command writes exactly the damaged chunks again
    assert_ok(invoke("info", url, "--verify"))
    assert_identical(url, local["small"])


def test_a_read_request_that_fails_is_one_line_not_a_damaged_chunk(bucket, monkeypatch):
    """A chunk whose GET failed (a 503, a reset, a 403) was reported as damaged, and the next extract re-extracted
    it (clearing `complete`): the request's failure is one line, and the store stays as it was."""
    import obstore.exceptions

    from reservoir.readouts import fit_linear
    from reservoir.store import checks

    url = f"s3://{bucket}/a.zarr"
    assert_ok(invoke(*SMALL, "--out", url))
    with FeatureStore.open(url) as st:
        read = st._b.read

        def failing(name, *a, **k):
            if name in ("train/features", "train/done"):
                raise obstore.exceptions.GenericError(f"Error performing GET http://host/{name}/c/1: 503")
            return read(name, *a, **k)

        monkeypatch.setattr(st._b, "read", failing)
        for call in (lambda: fit_linear(st, layers=[1]), lambda: checks.verify(st)):
            with pytest.raises(ReservoirError, match=r"could not read train/(features|done) \(Error performing GET "
                                                     r".*503\); the store is not damaged by it") as err:
                call()
            assert not isinstance(err.value, checks.Damaged)
    with FeatureStore.open(url) as st:
        assert st.complete and checks.verify(st) == {}


def test_a_garbled_chunk_object_is_one_line_and_a_clean_exit(bucket, tmp_path):
    """One chunk that Zarr cannot decode fails a read of many while its sibling requests are in flight: they are
    waited for, so the process ends with the one line (no callbacks into a closed event loop, no crash at exit)."""
    import obstore

    url = f"s3://{bucket}/garbled.zarr"
    assert_ok(invoke(*SMALL, "--out", url))
    store = remote.StoreURL(url).objects
    obstore.put(store, sorted(k for k in objects(url) if k.startswith("train/done/c/"))[0], b"xyz")
    feature = sorted(k for k in objects(url) if k.startswith("test/features/c/"))[0]
    obstore.put(store, feature, b"\0\0")  # truncated
    for args in (["info", url, "--verify"], ["fit-linear", url, "--layer", "2", "--results", str(tmp_path)]):
        r = subprocess.run([sys.executable, "-m", "reservoir.cli", *args], capture_output=True, text=True, env=env(),
                           timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("Error: "), (args, r.stderr)
        assert "damaged" in r.stderr


def test_a_failed_write_of_complete_is_one_line_and_the_same_command_finishes(bucket, local, monkeypatch):
    import obstore

    from reservoir.store import backends

    url = f"s3://{bucket}/last-write.zarr"
    write_attrs = backends.ZarrBackend.write_attrs

    def failing(self, attrs, replace=False):
        if attrs.get("complete") is True:
            raise obstore.exceptions.GenericError("simulated: connection reset by peer")
        return write_attrs(self, attrs, replace)

    with monkeypatch.context() as m:
        m.setattr(backends.ZarrBackend, "write_attrs", failing)
        assert_bad_input(r := invoke(*SMALL, "--out", url))
    assert "could not mark the store complete (simulated: connection reset by peer); every chunk is written: " \
           "rerun the same command to finish it" in r.stderr
    assert_ok(invoke(*SMALL, "--out", url))
    assert_identical(url, local["small"])


def test_a_new_stores_root_is_marked_ours_by_the_request_that_creates_it(bucket, local):
    """A kill right after the root's creation leaves a store the same command rebuilds, never 'other objects'."""
    import obstore

    from reservoir.store import backends
    from reservoir.store import layout as lay
    from reservoir.store.writable import _state

    url = remote.StoreURL(f"s3://{bucket}/first-request.zarr")
    backends.ZarrBackend(url, "w")  # what a creation killed at once leaves
    assert objects(str(url)) == ["zarr.json"]
    assert json.loads(bytes(obstore.get(url.objects, "zarr.json").bytes()))["attributes"] == lay.BUILDING
    assert _state(url) == "building"
    assert_ok(invoke(*SMALL, "--out", str(url)))
    assert_identical(str(url), local["small"])


# ------------------------------------------------------------------ one writer: the lease
def test_a_second_writer_is_refused_naming_the_holder(bucket):
    url = f"s3://{bucket}/held.zarr"
    with leases.Lease(remote.StoreURL(url), job="other-job"):
        assert_bad_input(r := invoke(*SMALL, "--out", url))
        assert f"{url} is being written by pid {os.getpid()} on " in r.stderr and "(job other-job)" in r.stderr
    assert not objects(url)  # the refused writer wrote nothing


def test_an_expired_lease_is_taken_over_by_exactly_one_of_two_takers(bucket, monkeypatch):
    import obstore

    url = remote.StoreURL(f"s3://{bucket}/expired.zarr")
    dead = {"pid": 1, "host": "another-host", "job": None, "started": "2026-01-01T00:00:00+00:00",
            "expires": time.time() - 5}
    obstore.put(url.bucket_store, leases.lease_key(url), json.dumps(dead).encode())
    assert leases.holder(url) is None
    won, lost = [], []

    def take():
        try:
            won.append(leases.Lease(url).acquire())
        except ReservoirError as err:
            lost.append(str(err))

    for _ in range(5):  # a race each time: the expired lease put back, two takers started together
        obstore.put(url.bucket_store, leases.lease_key(url), json.dumps(dead).encode())
        won.clear(), lost.clear()
        threads = [threading.Thread(target=take) for _ in range(2)]
        [t.start() for t in threads], [t.join() for t in threads]
        assert len(won) == 1 and len(lost) == 1, (won, lost)
        assert f"is being written by pid {os.getpid()}" in lost[0]
        won[0].release()
    assert leases.holder(url) is None


def test_a_holder_that_lost_its_lease_stops_at_its_next_write(bucket, monkeypatch):
    import obstore

    monkeypatch.setenv(leases.ENV_SECONDS, "1")
    url = remote.StoreURL(f"s3://{bucket}/lost.zarr")
    lease = leases.Lease(url).acquire()
    record, version = leases.read(url)
    obstore.put(url.bucket_store, leases.lease_key(url), json.dumps({**record, "pid": 2, "host": "thief"}).encode(),
                mode=version)  # another writer's takeover
    deadline = time.time() + 5
    while lease.held and time.time() < deadline:
        time.sleep(0.05)
    taken = "lost the store's write lease \\(another writer has taken it over: pid 2 on thief "  # the taker named
    with pytest.raises(ReservoirError, match=taken):
        lease.check()
    lease.release()
    assert leases.read(url)[0]["host"] == "thief"  # a lost lease is never deleted by its former holder


def test_a_store_that_compares_versions_not_etags_keeps_and_hands_over_the_lease(bucket, server, monkeypatch):
    """GCS matches an update against the object's generation, not its ETag; obstore refuses an update without a
    version before any request. Here: a versioned bucket, and updates without a version refused as GCS's client
    does. The holder renews for longer than its time to live, and an expired lease is taken over."""
    import boto3
    import obstore

    boto3.client("s3", endpoint_url=server).put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    put = obstore.put

    def like_gcs(store, key, data, *args, mode=None, **kw):
        if isinstance(mode, dict) and not mode.get("version"):
            raise obstore.exceptions.GenericError("Version required for conditional update")
        return put(store, key, data, *args, mode=mode, **kw)

    monkeypatch.setattr(obstore, "put", like_gcs)
    monkeypatch.setenv(leases.ENV_SECONDS, "1")
    url = remote.StoreURL(f"s3://{bucket}/gcs-like.zarr")
    lease = leases.Lease(url, "job-a").acquire()
    time.sleep(1.2)  # past its first expiry: only renewals keep it
    lease.check()
    assert lease.held and leases.holder(url)["job"] == "job-a"
    lease.release()
    assert leases.read(url) == (None, None)
    gone = {"pid": 1, "host": "elsewhere", "started": "2026-01-01T00:00:00+00:00", "expires": time.time() - 60}
    put(url.bucket_store, leases.lease_key(url), json.dumps(gone).encode())  # a holder that died elsewhere
    with leases.Lease(url, "job-b"):
        assert leases.holder(url)["job"] == "job-b"


def test_a_store_that_gives_no_versions_is_refused(bucket, monkeypatch):
    """Without an ETag or a version no update can be conditional: a lease could neither be renewed nor taken over
    by exactly one writer."""
    import obstore

    put = obstore.put
    monkeypatch.setattr(obstore, "put", lambda *a, **kw: {**put(*a, **kw), "e_tag": None, "version": None})
    url = remote.StoreURL(f"s3://{bucket}/unversioned.zarr")
    with pytest.raises(ReservoirError, match="gives its objects no version \\(ETag\\), so a single writer cannot"):
        leases.Lease(url).acquire()
    assert leases.read(url) == (None, None)


def _lease_puts_fail(monkeypatch):
    """Every write of a lease object fails from now on, as in an outage (the store's other objects are written)."""
    import obstore

    put = obstore.put

    def failing(store, key, *args, **kw):
        if key.endswith(".lease"):
            raise obstore.exceptions.GenericError("simulated: connection reset")
        return put(store, key, *args, **kw)

    monkeypatch.setattr(obstore, "put", failing)


def test_a_lease_write_whose_response_was_lost_is_the_writers_own(bucket, monkeypatch):
    """The store applied a conditional lease write, its response was lost, and the client's retry was refused
    (the object exists, or its version moved): taking the lease refused the writer as busy with itself, a renewal
    stopped the run as lost to itself. The lease read back is the one the write sent: it is ours."""
    import obstore

    put, lost = obstore.put, []

    def applied_then_refused(store, key, *args, **kw):
        result = put(store, key, *args, **kw)  # (the check's second create is refused here, as it should be)
        kind = "create" if kw.get("mode") == "create" else "renewal"
        if key.endswith(".lease") and kind not in lost:  # the first create, and the first renewal
            lost.append(kind)
            raise obstore.exceptions.PreconditionError("simulated: the retry of an applied write")
        return result

    monkeypatch.setenv(leases.ENV_SECONDS, "1")
    url = remote.StoreURL(f"s3://{bucket}/lost.zarr")
    monkeypatch.setattr(obstore, "put", applied_then_refused)
    lease = leases.Lease(url, "job-a").acquire()
    time.sleep(0.8)  # renewals every quarter second: the first one's response lost, the later ones fine
    lease.check()
    assert len(lost) == 2 and leases.holder(url)["pid"] == os.getpid() and lease.held
    lease.release()
    assert leases.read(url)[0] is None


def test_a_holder_whose_renewals_fail_stops_before_its_lease_expires(bucket, monkeypatch):
    """A failed renewal never counts: once the expiry the server holds, less a quarter of the time to live, has
    passed, the holder refuses to write (before a second writer can take the expired lease), and stays refused."""
    monkeypatch.setenv(leases.ENV_SECONDS, "1")
    url = remote.StoreURL(f"s3://{bucket}/outage.zarr")
    lease = leases.Lease(url, "job-a").acquire()
    lease.check()
    with monkeypatch.context() as m:
        _lease_puts_fail(m)
        time.sleep(0.3)  # a renewal already under way has landed; every later one fails
        expires = leases.read(url)[0]["expires"]  # the last expiry the server accepted
        while time.time() <= expires - 0.25 + 0.01:
            time.sleep(0.01)
        with pytest.raises(ReservoirError, match="lost the store's write lease \\(it could not be renewed before it "
                                                 "expired"):
            lease.check()
        assert not lease.held
        while time.time() <= expires + 0.05:
            time.sleep(0.05)
    assert leases.holder(url) is None  # expired on the server
    other = leases.Lease(url, "job-b").acquire()  # renewals work again: a second writer takes the expired lease
    time.sleep(0.5)  # the first holder's renewing thread would have renewed by now, had it gone on
    with pytest.raises(ReservoirError, match="lost the store's write lease"):
        lease.check()
    assert leases.holder(url)["job"] == "job-b"
    lease.release()  # never deletes the lease it lost
    assert leases.read(url)[0]["job"] == "job-b"
    other.release()


def test_a_store_whose_lease_is_lost_is_neither_completed_nor_discarded(bucket, monkeypatch):
    import obstore

    monkeypatch.setenv(leases.ENV_SECONDS, "1")
    url = f"s3://{bucket}/lost-store.zarr"
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0],
             "dtype": "float32", "pooling": {"kinds": ["last"], "n_out_tokens": 1}, "full_seq_layer": None}
    st = WritableStore.create(url, attrs, {"train": (2, ())}, (1, 1, 3), np.eye(2, 3, dtype=np.float32))
    u = remote.StoreURL(url)
    record, version = leases.read(u)
    obstore.put(u.bucket_store, leases.lease_key(u), json.dumps({**record, "pid": 2, "host": "thief"}).encode(),
                mode=version)  # another writer's takeover
    deadline = time.time() + 5
    while st._lock.held and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(ReservoirError, match="lost the store's write lease"):
        st.write_chunk("train", 0, np.ones((2, 1, 1, 3), np.float32), np.zeros(2), np.ones(2))
    with pytest.raises(ReservoirError, match="lost the store's write lease"):
        st.mark_complete()
    st.discard()  # nothing written, but the store may be the other writer's now: kept
    assert objects(url)
    with FeatureStore.open(url, allow_incomplete=True) as seen:
        assert not seen.complete


def test_a_backend_that_ignores_conditional_writes_is_refused(bucket, monkeypatch):
    import obstore

    put = obstore.put

    def unconditional(store, path, data, **kw):
        kw.pop("mode", None)
        return put(store, path, data, **kw)

    monkeypatch.setattr(obstore, "put", unconditional)
    assert_bad_input(r := invoke(*SMALL, "--out", f"s3://{bucket}/x.zarr"))
    assert "does not honour conditional writes (If-None-Match)" in r.stderr
    assert not objects(f"s3://{bucket}/x.zarr")
    assert leases.read(remote.StoreURL(f"s3://{bucket}/x.zarr")) == (None, None)  # its lease removed again


# ------------------------------------------------------------------ kills, races, a server that goes away
def _command(url: str) -> list[str]:
    return [sys.executable, "-m", "reservoir.cli", *SMALL, "--out", url]


def test_random_sigkill_then_same_command_is_bit_identical(bucket, local):
    rng = random.Random("s3-kill")
    for trial in range(3):
        url = f"s3://{bucket}/kill{trial}.zarr"
        proc = subprocess.Popen(_command(url), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and leases.holder(remote.StoreURL(url)) is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()  # reaped: its lease names a process of this host that is gone
        rerun = subprocess.run(_command(url), env=env(), capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr
        assert_identical(url, local["small"])


def test_two_racing_writers_one_refused_naming_the_holder_one_correct_store(bucket, local):
    url = f"s3://{bucket}/race.zarr"
    procs = [subprocess.Popen(_command(url), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    [(p.stdout.close(), p.stderr.close()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refusal = next(err for code, err in results if code == 2)
    assert f"{url} is being written by pid " in refusal and refusal.count("Error:") == 1
    assert_identical(url, local["small"])


def test_a_server_that_goes_away_stops_the_run_in_one_line_and_the_same_command_resumes(local, tmp_path,
                                                                                        monkeypatch):
    import boto3

    srv = start_server()
    host, port = srv.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for k, v in {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="gone")
    url = "s3://gone/x.zarr"
    cmd = [*_command(url), "--storage-option", "max_retries=1", "--storage-option", "retry_timeout=2"]
    wrapper = tmp_path / "slow.py"  # one chunk a window, each write a little slow: the server stops mid-run
    wrapper.write_text("import sys, time\nimport reservoir.extract.plan\nfrom reservoir.store import WritableStore\n"
                       "reservoir.extract.plan.WINDOW_ROWS = 1\nw = WritableStore.write_chunks\n"
                       "def slow(self, *a, **k):\n    time.sleep(0.3)\n    w(self, *a, **k)\n"
                       "WritableStore.write_chunks = slow\nfrom reservoir.cli import main\nsys.exit(main())\n")
    proc = subprocess.Popen([sys.executable, str(wrapper), *cmd[3:]], env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and not any(k.startswith("train/done/c/") for k in objects(url)):
        time.sleep(0.02)
    srv.stop()
    assert proc.wait(timeout=120) == 2
    err = [ln for ln in proc.stderr.read().splitlines() if ln.strip()]
    proc.stderr.close()
    assert len(err) == 1 and err[0].startswith(f"Error: {url}") and "Traceback" not in err[0], err
    srv = start_server(port)  # the same server back (moto keeps its objects in this process)
    try:
        rerun = subprocess.run(cmd, env=env(), capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr
        assert_identical(url, local["small"])
    finally:
        srv.stop()


# ------------------------------------------------------------------ sharded, no shared filesystem
def test_two_ranks_write_one_url_store_equal_to_one_local_process(bucket, local):
    url = f"s3://{bucket}/sharded.zarr"
    run = torchrun("-m", "reservoir", *ARGS, "--out", url, env={"OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    assert_identical(url, local["args"])
    assert arrays(url).keys() == arrays(local["args"]).keys()


# ------------------------------------------------------------------ the other readers of a URL
def test_train_from_a_split_point_store_and_a_recipe_cache_on_object_storage(bucket, tmp_path):
    url = f"s3://{bucket}/split.zarr"
    assert_ok(invoke("extract", "--task", "listops", "-p", "n_train=30", "-p", "n_test=10", "-p", "max_length=30",
                     "--backbone", "tiny-bert", "--layers", 2, "--full-seq-layer", 1, "--out", url, "--quiet"))
    assert_ok(invoke("train", "--from-store", url, "--backbone", "tiny-bert", "--finetune", "layernorm,output",
                     "--steps", 4, "--eval-every", 2, "--out", tmp_path / "run", "--quiet"))
    from reservoir.training import TrainResult

    assert TrainResult.read(tmp_path / "run" / "results.json").config["from_store"] == url
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: tiny-url\ndefaults: {backbone: tiny-gpt2, seeds: [0], task_params: {n_train: 64, "
                      "n_test: 32}}\ncells:\n  - {kind: fit-linear, task: bit-xor, layers: 2}\n")
    cache = f"s3://{bucket}/recipes"
    assert_ok(invoke("recipe", "run", recipe, "--out", tmp_path / "res", "--cache", cache, "--quiet"))
    stores = {k.split("/")[0] for k in objects(cache)}
    assert len(stores) == 1 and stores.pop().endswith(".zarr")
    assert_ok(invoke("recipe", "run", recipe, "--out", tmp_path / "res2", "--cache", cache))  # the store reused
    assert len({k.split("/")[0] for k in objects(cache)}) == 1


def test_bench_extract_times_the_pass_to_object_storage_beside_local_disk(bucket):
    r = invoke("bench", "extract", "--task", "bit-xor", "-p", "n_train=500", "-p", "n_test=100", "--backbone",
               "tiny-gpt2", "--layers", 2, "--naive-rows", 8, "--store-url", f"s3://{bucket}/bench", "--quiet")
    assert_ok(r)
    line = next(ln for ln in r.output.splitlines() if ln.startswith("pass / bare forward"))
    assert "(local disk); " in line and f" to s3://{bucket}/bench/bench-" in line and "object store / local = " in line
    assert not objects(f"s3://{bucket}/bench")  # the timed store is removed


def test_bench_extract_lists_the_bucket_before_the_local_pass(bucket):
    """A missing bucket was found only after the local pass and the bare forward had run (minutes at README size)."""
    r = invoke("bench", "extract", "--task", "bit-xor", "-p", "n_train=500", "-p", "n_test=100", "--backbone",
               "tiny-gpt2", "--layers", 2, "--naive-rows", 8, "--store-url", "s3://no-such-bucket-here/bench")
    assert_bad_input(r)
    assert "NoSuchBucket" in r.stderr and "task bit-xor" not in r.output + r.stderr  # before the task loads


def test_gcs_and_azure_urls_take_the_same_path():
    """No server for them here: their URLs parse and build obstore's GCS and Azure stores, and HDF5 is refused."""
    from reservoir.store import detect_format

    gs = remote.StoreURL("gs://bucket/prefix/x.zarr", {})
    az = remote.StoreURL("az://container/prefix/x.zarr", {"account_name": "account"})
    assert (gs.bucket, gs.key, gs.name, gs.suffix) == ("bucket", "prefix/x.zarr", "x.zarr", ".zarr")
    assert type(gs.objects).__name__ == "GCSStore" and type(az.objects).__name__ == "AzureStore"
    assert detect_format("gs://bucket/x.zarr") == "zarr"
    with pytest.raises(ReservoirError, match="HDF5 stores stay on a local filesystem"):
        detect_format("az://container/x.h5")
    for bad in ("s3://bucket", "s3://bucket/", "s3://bucket/a/../x.zarr"):
        with pytest.raises(ReservoirError, match="expected a store URL like s3://bucket/prefix/name.zarr"):
            remote.StoreURL(bad)


def test_a_url_that_a_parser_would_rewrite_is_refused_not_aliased(bucket):
    """obstore places objects where the parsed URL points: ``%2e%2e`` would climb out of the prefix, and two
    spellings of one place would take two leases and let two writers in. Such URLs are refused before any request."""
    for bad in ("team/%2e%2e/x.zarr", "a%20b/x.zarr", "x.zarr?v=1", "x.zarr#f", "a b/x.zarr", "a\\b/x.zarr",
                "a/x.zarr\n"):
        with pytest.raises(ReservoirError, match="expected a store URL without"):
            remote.StoreURL(f"s3://{bucket}/{bad}")
    assert_bad_input(r := invoke(*SMALL, "--out", f"s3://{bucket}/team/%2e%2e/x.zarr"))
    assert "expected a store URL without '%'" in r.stderr
    assert not objects(f"s3://{bucket}/x.zarr")
    assert remote.StoreURL(f"s3://{bucket}/year=2026/run+1@a,b/x.zarr").key == "year=2026/run+1@a,b/x.zarr"


def test_an_aws_profile_gives_the_credentials(bucket, local, tmp_path, monkeypatch):
    pytest.importorskip("boto3")
    (tmp_path / "credentials").write_text("[lab]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    (tmp_path / "config").write_text("[profile lab]\nregion = us-east-1\n")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    url = f"s3://{bucket}/profile.zarr"
    assert_ok(invoke(*SMALL, "--out", url, "--storage-option", "profile=lab"))
    from reservoir.store.remote import configure

    configure({"profile": "lab"})  # the command's options held while it ran; this process reads with its own
    try:
        assert_identical(url, local["small"])
    finally:
        configure(None)
    assert_bad_input(r := invoke("info", url, "--storage-option", "profile=nobody"))
    assert "AWS profile 'nobody': " in r.stderr


def test_other_ranks_stop_writing_when_rank_0s_lease_is_gone(bucket):
    from reservoir.store.lock import SharedLock

    url = f"s3://{bucket}/shared.zarr"
    lease = leases.Lease(remote.StoreURL(url), job="job-0").acquire()
    SharedLock(url, lease.record).check()  # rank 0 holds it: writing goes on
    lease.release()
    with pytest.raises(ReservoirError, match="write lease while the other ranks write; found it released or expired"):
        SharedLock(url, lease.record).check()
    other = leases.Lease(remote.StoreURL(url), job="job-1").acquire()  # another job took the store
    with pytest.raises(ReservoirError, match=f"expected rank 0 of this job \\(pid {os.getpid()} on .*\\(job job-0\\)"
                                             ".* found it held by pid .*\\(job job-1\\)"):
        SharedLock(url, lease.record).check()
    other.release()


def test_a_dead_pid_expires_a_lease_only_in_the_holders_own_process_space():
    """A holder on this host name whose pid is not alive here has ended, unless its record names another boot or
    PID namespace (a container sharing the host name): there, this process table says nothing about it."""
    import socket
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()  # a pid that existed and is gone
    live = {"pid": child.pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00+00:00",
            "expires": time.time() + 60}
    assert leases.process_space() is not None  # Linux: boot id and PID namespace
    assert leases.expired({**live, "space": leases.process_space()})
    assert leases.expired(live)  # records of earlier versions: judged by host name and pid, as before
    assert not leases.expired({**live, "space": "another-boot/pid:[1]"})
    assert not leases.expired({**live, "pid": os.getpid(), "space": leases.process_space()})
    assert not leases.expired({**live, "host": "another-host"})
    assert leases.expired({**live, "expires": time.time() - 1, "space": "another-boot/pid:[1]"})
