"""Loading from the Hugging Face hub or a model folder: the offline probe, the load report, one-line errors.

A hub id that is not in the local Hugging Face cache is fetched only when the
hub answers within :data:`HUB_TIMEOUT_S` (and ``HF_HUB_OFFLINE`` is unset);
otherwise it is refused at once in one line. ``transformers``' load report is
replaced by one line: weights of the wrong shape are refused, parameters of
the modules reservoir runs that the checkpoint lacks are named.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from reservoir.backbones.arch import arch_for
from reservoir.errors import ReservoirError
from reservoir.io import one_line

log = logging.getLogger("reservoir")

#: Seconds the hub may take to answer before a hub id not in the local cache is refused as unreachable.
HUB_TIMEOUT_S = 3.0


def hub_offline(name: str, revision: str, builtin: list[str]) -> bool:
    """Whether hub id ``name`` must load from the local Hugging Face cache alone (no network).

    ``builtin``: the names that need no hub (named in the one-line refusals).

    True under ``HF_HUB_OFFLINE`` or when the hub does not answer within
    :data:`HUB_TIMEOUT_S`; then, unless the id's ``config.json`` is cached at
    ``revision``, a ReservoirError says so in one line at once (instead of
    the hub client's retries). A name that is no valid hub id is refused first.
    """
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    expected = f"expected a built-in name ({', '.join(builtin)}), a model folder, or a hub id"
    try:
        validate_repo_id(name)
    except HFValidationError as err:
        raise ReservoirError(f"backbone {name!r}: {expected}; found not a built-in name, not a folder, and not a "
                             f"valid hub id ({one_line(err)})") from None
    if not constants.HF_HUB_OFFLINE and hub_reachable(constants.ENDPOINT):
        return False
    if isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str):
        return True
    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"the hub {constants.ENDPOINT} is unreachable"
    raise ReservoirError(f"backbone {name!r}: {expected} that is cached or downloadable; found not a built-in name, "
                         f"not a folder, not in the Hugging Face cache, and {why}")


@functools.lru_cache(maxsize=None)
def hub_reachable(endpoint: str) -> bool:
    """Whether ``endpoint`` answers a HEAD request within :data:`HUB_TIMEOUT_S` (any status; proxies apply)."""
    import http.client
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return True  # the server answered
    except (OSError, ValueError, http.client.HTTPException):  # no route, no DNS, refused, timed out, bad URL
        return False
    return True


def from_pretrained(name: str, source: str, **kwargs):
    """``AutoModel.from_pretrained`` with transformers' load report replaced by one line.

    Weights whose shapes differ from what ``config.json`` gives are refused;
    parameters the checkpoint lacks (left at their random init) are named in
    one warning line.
    """
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, loading = AutoModel.from_pretrained(source, output_loading_info=True, ignore_mismatched_sizes=True,
                                                   **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    mismatched = sorted(loading["mismatched_keys"])
    if mismatched:
        key, found, expected = mismatched[0]
        raise ReservoirError(f"backbone {name!r}: expected weights of the shapes its config.json gives; found "
                             f"{len(mismatched)} that differ, e.g. {key} {tuple(found)} where the config gives "
                             f"{tuple(expected)}")
    arch = arch_for(model.config.model_type)
    # a pooler or an embedding reservoir never runs is no concern of the user's
    missing = sorted(k for k in loading["missing_keys"] if any(k == p or k.startswith(p + ".") for p in arch.kept))
    if missing:
        log.warning("backbone %s: %d parameter(s) not in the checkpoint keep their random init (%s)", name,
                    len(missing), ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else ""))
    return model


#: Weight files that are pickles (``torch.load`` of a pickle can run code): never read.
PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_folder(name: str, folder: Path) -> None:
    """Refuse (one line) a model folder whose loading would read outside it or read a pickle.

    ``config.json``, every ``*.safetensors`` file and every file a
    ``model.safetensors.index.json`` names must resolve inside the folder
    (symbolic links included; in a Hugging Face cache snapshot, links into the
    repository's own ``blobs`` folder are its layout and allowed), the JSON
    files be regular and at most :data:`~reservoir.io.MAX_JSON_BYTES`, and the
    weights be safetensors: a folder with only pickled weights
    (``pytorch_model.bin``) is refused rather than unpickled.
    """
    import os

    from reservoir.io import check_regular, read_json

    root = folder.resolve()
    allowed = [root]
    for snapshot in (folder, root):  # models--org--name/snapshots/<rev>/file -> ../../blobs/<hash> (or a link to it)
        if snapshot.parent.name == "snapshots":
            allowed.append((snapshot.parent.parent / "blobs").resolve())

    def inside(path: Path, what: str) -> Path:
        real = Path(os.path.realpath(path))
        if not any(real == top or top in real.parents for top in allowed):
            raise ReservoirError(f"backbone {name!r}: expected {what} inside the model folder {folder}; found "
                                 f"{path.name} resolving to {real}")
        return real

    config = folder / "config.json"
    if config.exists() or config.is_symlink():
        check_regular(inside(config, "config.json"), "a config.json")
        read_json(config, "a model's config.json")  # bounded: a huge file is one line, not gigabytes parsed
    for weights in sorted(folder.glob("*.safetensors")):
        inside(weights, "its weights")
    index = folder / "model.safetensors.index.json"
    if index.exists() or index.is_symlink():
        inside(index, "its weights index")
        data = read_json(index, "a safetensors index (a JSON object with a weight_map)")
        shards = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(shards, dict) or not all(isinstance(f, str) for f in shards.values()):
            raise ReservoirError(f"{index}: expected a safetensors index (a JSON object with a weight_map of file "
                                 "names); found none")
        for shard in sorted(set(shards.values())):
            if os.path.isabs(shard) or ".." in Path(shard).parts:
                raise ReservoirError(f"backbone {name!r}: expected the weights index to name files inside the "
                                     f"model folder {folder}; found {shard!r}")
            inside(folder / shard, "its weight shards")
    if not any(folder.glob("*.safetensors")):
        pickles = sorted(p.name for pattern in PICKLED for p in folder.glob(pattern))
        if pickles:
            raise ReservoirError(f"backbone {name!r}: expected weights in safetensors files (model.safetensors); "
                                 f"found only pickled weights ({', '.join(pickles[:3])}), which are never read "
                                 "(unpickling can run code): convert them to safetensors with a trusted copy")


def load_error(name: str, source: str, is_folder: bool, err: Exception) -> ReservoirError:
    """One line for a backbone that transformers could not load, naming the folder (and weights file) or hub id."""
    from safetensors import SafetensorError

    found = one_line(err)[:300]
    if is_folder and isinstance(err, SafetensorError):
        weights = sorted(p.name for p in Path(source).glob("*.safetensors"))
        found = f"unreadable weights {', '.join(weights)} ({found})"
    where = "folder" if is_folder else "hub id"
    return ReservoirError(f"could not load backbone {name!r} as a {where}: expected a Hugging Face model "
                          f"(config.json and weights), found: {found}")
