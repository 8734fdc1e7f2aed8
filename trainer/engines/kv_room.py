"""A key/value cache that grows into room allocated ahead, instead of copying itself every step.

transformers' DynamicLayer appends a decode step's keys and values with torch.cat, which copies
the whole cache: for SmolLM2-135M at 16 rows and 800 cached tokens that is 590 MB of float32 moved
per generated token, far more than the step's own matmuls read. RoomLayer keeps each layer's keys
and values in a buffer with room past the filled part, writes a step into that room, and hands
attention a view of the filled part. The engine allocates the room a generate call needs
(its max_new_tokens) when it builds the cache, so a reply never reallocates; past that the
room grows geometrically, so appends cost amortised O(new tokens).

Anything that assigns `keys`/`values` (transformers' batch_select_indices, crop, reorder_cache,
offload) hands the layer a new tensor, which becomes its buffer as it is: no room, and the next
append grows it.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class RoomLayer(DynamicLayer):
    """One attention layer's cache, (batch, kv_heads, filled, head_dim) seen through `keys` and
    `values`, stored in buffers of (batch, kv_heads, capacity, head_dim)."""

    def __init__(self, room: int = 0):
        """`room`: positions to allocate past the first append (a generate call's max_new_tokens)."""
        if room < 0:
            raise ValueError(f"RoomLayer: room must be >= 0, got {room}")
        self.room = room
        self._k = self._v = None
        self._n = self._nv = 0  # filled positions of keys and of values (equal between calls)
        super().__init__()

    # keys/values are views of the buffers' filled part; assigning one adopts the tensor as the buffer
    @property
    def keys(self):
        return None if self._k is None else self._k[:, :, :self._n]

    @keys.setter
    def keys(self, t):
        self._k = t
        self._n = 0 if t is None or t.dim() < 2 else t.shape[-2]

    @property
    def values(self):
        return None if self._v is None else self._v[:, :, :self._nv]

    @values.setter
    def values(self, t):
        self._v = t
        self._nv = 0 if t is None or t.dim() < 2 else t.shape[-2]

    def capacity(self) -> int:
        """Positions the buffers hold, filled or not."""
        return 0 if self._k is None or self._k.dim() < 2 else self._k.shape[-2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def _grow(self, buf, new: torch.Tensor, need: int, extra: int):
        out = new.new_empty(*new.shape[:2], need + extra, new.shape[-1])
        if self._n:
            out[:, :, :self._n] = buf[:, :, :self._n]
        return out

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append (batch, kv_heads, q, head_dim) keys and values; returns the filled views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._n != self._nv:
            raise ValueError(f"RoomLayer.update: keys hold {self._n} positions but values {self._nv}")
        need = self._n + key_states.shape[-2]
        if need > self.capacity():
            # the first append takes the room asked for; later growth a quarter more, at least 32
            extra = self.room if self.capacity() == 0 else max(32, need // 4)
            self._k = self._grow(self._k, key_states, need, extra)
            self._v = self._grow(self._v, value_states, need, extra)
        self._k[:, :, self._n:need] = key_states
        self._v[:, :, self._n:need] = value_states
        self._n = self._nv = need
        return self.keys, self.values


def room_cache(n_layers: int, room: int, data: list | None = None) -> DynamicCache:
    """A DynamicCache of `n_layers` RoomLayers, each with `room` free positions past its data.
    `data`: per layer (keys, values) of (batch, kv_heads, length, head_dim) to start from (copied
    once into the layer's buffer), or None for an empty cache that generate's prefill fills."""
    if data is not None and len(data) != n_layers:
        raise ValueError(f"room_cache: data has {len(data)} layers, n_layers is {n_layers}")
    cache = DynamicCache()
    cache.layers = [RoomLayer(room) for _ in range(n_layers)]
    for layer, kv in zip(cache.layers, data or []):
        layer.update(kv[0], kv[1])
    return cache
