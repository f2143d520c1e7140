"""Feature stores: ``extract`` writes one, ``info`` describes and verifies it, ``tasks`` lists what can fill it."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from reservoir.cli.common import (
    _parse_layers,
    _task_from,
    data_options,
    extract_option,
    forward_options,
    storage_option,
)
from reservoir.errors import ReservoirError


@click.command()
@extract_option("task", default=None)
@data_options
@extract_option("task_params", "--param", "-p", "params", multiple=True, metavar="KEY=VALUE", default=None)
@extract_option("backbone")
@extract_option("init")
@extract_option("layers", type=str)
@extract_option("pooling", metavar="last|first|mean")
@extract_option("out")
@extract_option("format", "--format", "fmt")
@forward_options
@extract_option("projection_gain")
@extract_option("projection")
@extract_option("revision")
@extract_option("full_seq_layer")
@extract_option("truncate")
@click.option("--download", is_flag=True,
              help="Fetch the dataset files from their usual source first (mnist, fashion-mnist, cifar10, cifar10-lra).")
@storage_option(out="--out")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def extract(task, data, input_column, label_column, params, backbone, init, layers, pooling, out, fmt, batch_size,
            max_tokens, writers, dtype, device, amp, seed, gain, projection, revision, full_seq_layer, truncate,
            download, quiet):
    """Run a task through a frozen backbone once and store every layer's features."""
    from reservoir.distributed import is_leader
    from reservoir.extract import ExtractConfig
    from reservoir.extract import run as run_extract
    from reservoir.store import FeatureStore

    task, task_params = _task_from(task, data, input_column, label_column, params)
    if out is not None and not out.strip():
        raise click.BadParameter("expected a store path (.zarr or .h5), or no --out for the default; found an empty "
                                 "path", param_hint="--out")
    if download:
        if "download" in task_params:
            raise click.UsageError(f"expected --download or -p download=..., not both; found --download and "
                                   f"-p download={json.dumps(task_params['download'])}")
        task_params["download"] = True
    config = ExtractConfig(task=task, backbone=backbone, init=init, layers=_parse_layers(layers), out=out, format=fmt,
                           task_params=task_params, seed=seed, projection_gain=gain, projection=projection,
                           batch_size=batch_size,
                           max_tokens=max_tokens, writers=writers, dtype=dtype, device=device, amp=amp,
                           revision=revision, truncate=truncate, full_seq_layer=full_seq_layer, pooling=pooling)
    timings: dict[str, float] = {}
    path = run_extract(config, progress=not quiet, timings=timings)
    if not is_leader():
        return  # a rank of a sharded run (torchrun): rank 0 reports
    with FeatureStore.open(path) as store:
        shapes = ", ".join(f"{s} {tuple(store.features(s).shape)}" for s in store.splits)
        pooled = "" if store.poolings == ["last"] else f"; pooling {','.join(store.poolings)}"
        done = "wrote" if "pass_s" in timings else "already complete with these settings, nothing written:"
        click.echo(f"{done} {path} ({store.format}): {shapes}; layers {store.layers}{pooled}")


@click.command()
@click.argument("store", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the store's attributes as JSON.")
@click.option("--verify", is_flag=True, help="Read every written chunk and check it against its checksums.")
@storage_option(store="STORE")
def info(store, as_json, verify):
    """Print a store's provenance, splits, shapes, layers and completeness (--verify: check every chunk)."""
    from reservoir.store import FeatureStore
    from reservoir.store.lock import describe, holder

    with FeatureStore.open(store, allow_incomplete=True) as st:
        if as_json:
            click.echo(json.dumps(st.attrs, indent=2))
        else:
            _describe_store(st)
            if not st.complete:
                writer = holder(st.path)
                click.echo(f"status     {'being written by ' + describe(writer) if writer is not None else 'interrupted'}"
                           f"{'' if writer is not None else '; rerun the extract command to finish it'}")
        if verify:
            _verify_store(st)


def _verify_store(st) -> None:
    """``info --verify``: every chunk and fixed array against its checksum; one error line if any is damaged."""
    bad, bad_fixed = st.verify(progress=sys.stderr.isatty()), st.verify_fixed()
    for split in st.splits:
        written = st.shape(split, "done")[0] if st.complete else int(st.done(split).sum())
        found = bad.get(split, {})
        click.echo(f"verify     {split}: {written - len(found)}/{written} written chunks match their checksums")
        for c, reason in sorted(found.items()):
            click.echo(f"           chunk {c}: {reason}")
    fixed = st.attrs["checksums"]["fixed"]
    click.echo(f"verify     {len(fixed) - len(bad_fixed)}/{len(fixed)} fixed arrays (projection, final norm) match")
    for name, reason in bad_fixed.items():
        click.echo(f"           {reason}")
    if bad or bad_fixed:
        raise ReservoirError(f"{st.path}: {sum(map(len, bad.values()))} damaged chunk(s), {len(bad_fixed)} damaged "
                             "array(s); rerun the extract command that wrote it to repair them")


def _describe_store(st) -> None:
    """The store's settings, as far as its attributes record them (a store made through the Python API may hold only
    what :meth:`WritableStore.create` needs: the rest reads ``unrecorded``)."""
    a = st.attrs
    bb, task, p = a["backbone"], a["task"], a["projection"]

    def got(d: Any, key: str, width: int | None = None) -> str:
        """``d[key]`` as text (cut to ``width`` characters and ``...``), ``unrecorded`` when it is not there."""
        if not isinstance(d, dict) or key not in d or (width is not None and d[key] is None):
            return "unrecorded"
        return f"{str(d[key])[:width]}..." if width is not None else str(d[key])

    params = json.dumps(task["params"], sort_keys=True) if "params" in task else "params unrecorded"
    click.echo(f"store      {st.path} ({st.format}, schema {a['schema']}, reservoir {a.get('reservoir_version')})")
    click.echo(f"complete   {st.complete}   created {a.get('created')}")
    click.echo(f"backbone   {got(bb, 'id')} ({got(bb, 'family')}, {got(bb, 'n_layer')} layers, {bb['n_dim']} dim) "
               f"init={got(bb, 'init')} seed={got(bb, 'seed')} revision={bb.get('revision')}")
    click.echo(f"weights    sha256 {got(bb, 'weights_sha256', 16)}")
    click.echo(f"task       {got(task, 'name')} {params}")
    click.echo(f"           fingerprint {got(task, 'fingerprint', 16)}  classes {got(task, 'n_classes')}  "
               f"label shape {task['label_shape']}")
    click.echo(f"projection {got(p, 'kind')} d_in={got(p, 'd_in')} gain={got(p, 'gain')} seed={got(p, 'seed')} "
               f"({got(p, 'input')} inputs)")
    norm = "stored" if "final_norm/weight" in a["arrays"] else "none"
    computed = a.get("compute_dtype") or "an unrecorded dtype"
    click.echo(f"layers     {st.layers}   pooling {','.join(st.poolings)} x{a['pooling']['n_out_tokens']}   "
               f"dtype {a['dtype']} (computed in {computed})   final norm {norm}")
    if st.full_seq_layer is not None:
        click.echo(f"split      every position's state at layer {st.full_seq_layer} (train --from-store)")
    truncated = task.get("truncated")
    if isinstance(truncated, dict):
        click.echo(f"truncated to {truncated.get('max_tokens')} tokens; rows cut: {truncated.get('rows_cut')}")
    for split in st.splits:
        done = st.done(split)
        click.echo(f"  {split:<10} features {tuple(st.features(split).shape)}  labels "
                   f"{st.shape(split, 'labels')}  chunks {int(done.sum())}/{len(done)} done")


@click.command()
def tasks():
    """List the registered tasks, their defaults and where their data comes from."""
    from reservoir.tasks import TASKS

    for name in sorted(TASKS):
        spec = TASKS[name]
        click.echo(f"{name:<16} {spec.summary}")
        click.echo(f"{'':<16} tokens: {spec.tokens or '?'}   input dim: {spec.d_in or '?'}   "
                   f"classes: {spec.classes or '?'}   splits: {spec.splits}")
        click.echo(f"{'':<16} data: {spec.source}")
        click.echo(f"{'':<16} params: {json.dumps(spec.defaults)}")
