"""The feature store (Zarr or HDF5, on disk; Zarr on object storage): atomic creation, one writer at a time,
checksummed chunks.

See :mod:`reservoir.store.feature_store` for the layout and what it guarantees, and
:mod:`reservoir.store.writable` for writing one.
"""

from reservoir.store.checks import Damaged
from reservoir.store.feature_store import KEY_FIELDS, SCHEMA, FeatureStore, first_difference, store_key
from reservoir.store.files import MIN_CHUNK_BYTES, remove, rows_per_chunk, store_path
from reservoir.store.formats import detect_format
from reservoir.store.remote import StoreURL, is_url
from reservoir.store.writable import WritableStore

__all__ = ["KEY_FIELDS", "MIN_CHUNK_BYTES", "SCHEMA", "Damaged", "FeatureStore", "StoreURL", "WritableStore",
           "detect_format", "first_difference", "is_url", "remove", "rows_per_chunk", "store_key", "store_path"]
