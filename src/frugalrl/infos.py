"""Infos batched as Gymnasium's vector envs batch them: a value array and a ``_key`` mask per key, nested dicts as
dicts of the same. A worker batches its envs' infos (:func:`add_info`, or :func:`flat_infos` for the common case of
flat numbers with the same keys in every env), the head merges the workers' (:mod:`frugalrl.envs.batching`), and
anything that is not data stays on the worker."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def add_info(infos: dict[Any, Any], info: dict[Any, Any], i: int, k: int,
             first_dtypes: dict[tuple[Any, ...], np.dtype] | None = None, path: tuple[Any, ...] = ()) -> list[str]:
    """Batch one env's infos into ``infos`` as Gymnasium's ``_add_info`` does (value array + ``_key`` mask):
    numbers and arrays in arrays of their dtype, nested dicts as dicts of the same; strings, None, lists and numpy
    booleans as data (:func:`info_data`) in object arrays. Returns the keys of values that are none of these
    (only data leaves a worker), or arrays of another shape than the key's first: they are left out.

    The first env's value sets an array's dtype, and later ones are cast to it, as in Gymnasium; with
    ``first_dtypes`` (a worker's, which holds some of the vector env's envs) an array is widened instead, so that
    a value keeps what the vector env's first env may not truncate, and ``first_dtypes[path]`` keeps the dtype
    that the first env set (FrozenLake's ``prob``: 1 from a reset, 0.333 from a step)."""
    left_out = []
    for key, value in info.items():
        if not isinstance(key, str | int) or (key in infos and isinstance(infos[key], dict) != isinstance(value, dict)):
            left_out.append(str(key))  # a key JSON cannot name, or one whose kind changed between envs
            continue
        if isinstance(value, dict):
            left_out += [f"{key}.{sub}" for sub in add_info(infos.setdefault(key, {}), value, i, k, first_dtypes,
                                                            (*path, key))]
            _mask(infos, key, k)[i] = True
            continue
        arr = np.asarray(value) if isinstance(value, bool | int | float | np.number | np.ndarray) else None
        if arr is not None and arr.dtype != object:
            held = infos.get(key)
            if held is None:
                infos[key] = np.zeros((k, *arr.shape), dtype=arr.dtype)
            elif first_dtypes is not None and held.dtype != object:
                infos[key] = widened(held, arr.dtype)
                if infos[key] is not held:
                    first_dtypes.setdefault((*path, key), held.dtype)
            if infos[key].shape[1:] == arr.shape:
                infos[key][i] = arr
                _mask(infos, key, k)[i] = True
            else:  # Gymnasium's batch would fail here
                left_out.append(str(key))
            continue
        try:
            data = info_data(value)
        except TypeError:
            left_out.append(str(key))
            continue
        if key not in infos:
            infos[key] = np.full(k, None, dtype=object)
        if infos[key].dtype == object:  # a key that was a number in another env keeps its array
            infos[key][i] = data
            _mask(infos, key, k)[i] = True
    return left_out


_SCALAR_DTYPES: dict[type, np.dtype] = {
    t: np.asarray(t(0)).dtype
    for t in (float, int, bool, np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8)
}
"""The scalar types :func:`flat_infos` batches, with the dtype of an array that one of them starts (numpy's
booleans are data to :func:`add_info`, as to Gymnasium)."""


def flat_infos(infos: dict[int, dict[Any, Any]], k: int) -> dict[str, np.ndarray] | None:
    """What :func:`add_info` makes of the infos of envs ``infos`` (env index -> its info, in env order) when every
    one has the same string keys in the same order and each key's values are scalars of one type (MuJoCo's and
    ALE's step infos): one array per key instead of a call per env and key. None where they are anything else
    (the caller then goes env by env)."""
    rows = iter(infos.values())
    keys = tuple(next(rows))
    for info in rows:
        if len(info) != len(keys) or tuple(info) != keys:
            return None
    envs = list(infos)
    full = len(envs) == k
    out: dict[str, np.ndarray] = {}
    for key in keys:
        values = [info[key] for info in infos.values()]
        kind = type(values[0])
        dtype = _SCALAR_DTYPES.get(kind)
        if dtype is None or not isinstance(key, str) or key.startswith("_"):  # "_x" would meet x's mask
            return None
        for v in values:
            if type(v) is not kind:
                return None
        try:
            arr = np.array(values, dtype=dtype)
        except OverflowError:  # an int beyond int64: add_info keeps it as data
            return None
        if full:
            out[key], out[f"_{key}"] = arr, np.ones(k, dtype=bool)
        else:
            out[key], out[f"_{key}"] = np.zeros(k, dtype=dtype), np.zeros(k, dtype=bool)
            out[key][envs] = arr
            out[f"_{key}"][envs] = True
    return out


def widened(held: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``held`` itself where its dtype holds ``dtype``'s values exactly, else a copy in the smallest one that does."""
    wider = np.result_type(held.dtype, dtype)
    return held if wider == held.dtype else held.astype(wider)


def _mask(infos: dict[Any, Any], key: str | int, k: int) -> np.ndarray:
    mask = infos.get(f"_{key}")
    if mask is None:
        mask = infos[f"_{key}"] = np.zeros(k, dtype=bool)
    return mask


def info_arrays(infos: dict[Any, Any], path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], np.ndarray]]:
    """Every array of batched ``infos`` with its key path (nested dicts walked in order)."""
    out = []
    for key, value in infos.items():
        if isinstance(value, dict):
            out += info_arrays(value, (*path, key))
        else:
            out.append(((*path, key), value))
    return out


def info_name(path: tuple[Any, ...]) -> str:
    """The wire name of an info array: a top-level string key as it is, any other path as a JSON list (a key that
    starts with ``[`` too, so that names never clash)."""
    key = path[0]
    return key if len(path) == 1 and isinstance(key, str) and not key.startswith("[") else json.dumps(list(path))


def info_path(name: str) -> list[Any]:
    """The key path :func:`info_name` gave ``name``."""
    return json.loads(name) if name.startswith("[") else [name]


def info_parent(infos: dict[Any, Any], path: tuple[Any, ...]) -> dict[Any, Any]:
    """The dict of batched ``infos`` that holds the last key of ``path``."""
    for key in path[:-1]:
        infos = infos[key]
    return infos


def info_data(value: Any) -> Any:
    """``value`` as JSON data (numpy scalars as numbers, arrays and tuples as lists); ``TypeError`` for anything
    that is not data (an object, a dict with keys other than strings, which only a list can hold here)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, np.generic):
        return info_data(value.item())
    if isinstance(value, np.ndarray | list | tuple):
        return [info_data(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: info_data(v) for key, v in value.items()}
    raise TypeError(f"{type(value).__name__} is not data")
