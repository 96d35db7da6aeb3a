"""The experience uplink: which codec carries each stream of a worker's replies.

:class:`UplinkOptions` (the fields of ``ClusterConfig`` named ``uplink*``) says how experience travels, and
:class:`UplinkCodecs` picks each reply's stream codecs for one worker. Lossless by default: the learner gets the very
arrays the worker's policy acted on (float64 observations are float32 words by then: ``obs="fp32"``;
docs/clusterenv.md#the-experience-uplink).

``auto`` measures: on a stream's first message and every :data:`PROBE_EVERY` messages it encodes each
compressible stream (a rollout of float observations with and without the ``steps`` transform, keeping the
smaller), times it and counts the bytes saved; a stream is compressed while its encode time,
doubled for the learner's decoding, is under the link time its saving buys at ``link_mbps``. So a
stream that does not compress (noise) goes raw, and a fast link (``--uplink-link-mbps 10000``) turns the
codecs off where they would cost the actor more than they save; ``lz4`` / ``zstd`` always compress.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from frugalrl.wire import codecs as _codecs

Uplink = Literal["auto", "none", "lz4", "zstd"]
"""How the workers' experience is compressed on its way to the learner (losslessly)."""
UPLINK_OPTIONS: tuple[str, ...] = get_args(Uplink)
ObsCodec = Literal["fp32", "exact", "fp16", "bf16", "int8", "int16"]
"""How float observations of a rollout travel: as the float32 words a float32 network sees, exactly as the env
gave them, or rounded to a low-bit code (lossy)."""
OBS_CODECS: tuple[str, ...] = get_args(ObsCodec)
LOSSY_OBS: tuple[str, ...] = ("fp16", "bf16", "int8", "int16")
"""The codes that round float32 observations further, on the wire only (the workers act on the float32 ones)."""
Behaviour = Literal["recompute", "logprob", "params"]
"""What the workers send about the behaviour policy per step (``recompute``: nothing, where the head can)."""
BEHAVIOURS: tuple[str, ...] = get_args(Behaviour)

#: The experience streams the uplink applies to (array names of the workers' replies).
UPLINK_STREAMS: tuple[str, ...] = (
    "obs", "next_obs", "final_obs", "actions", "rewards", "terminations", "truncations", "dist_params",
    "behaviour_logp",
)
OBS_STREAMS: tuple[str, ...] = ("obs", "next_obs", "final_obs")
#: ``auto``'s compressor: zstd was smaller than lz4 on every stream of recorded LunarLander rollouts at a
#: negligible CPU cost (benchmarks/uplink.py).
AUTO_CODEC = "zstd"
#: Arrays smaller than this are not compressed (per-step replies: the header and the CPU cost would eat the
#: saving); booleans are still bit-packed.
MIN_COMPRESS_NBYTES = 1024
#: ``auto`` re-measures each stream's codec every this many messages.
PROBE_EVERY = 64


@dataclass(frozen=True)
class UplinkOptions:
    """How a worker's experience travels (``auto``: see the module docstring)."""

    compressor: Uplink = "auto"
    """``--uplink``: ``auto``, ``lz4``, ``zstd`` or ``none``. The streams of :data:`UPLINK_STREAMS` of at least
    :data:`MIN_COMPRESS_NBYTES` go through the compressor of :mod:`frugalrl.wire.lossless`, a rollout of stacked
    image frames (uint8, ``(T, k, S, H, W)``) first through the ``frames`` transform of
    :mod:`frugalrl.wire.transforms` (only each step's new frame); under ``auto`` a rollout of float observations
    also through its ``steps`` transform (each step as its difference from the one before) where that measures
    smaller; smaller boolean arrays are bit-packed, other small arrays stay raw."""
    obs: ObsCodec = "fp32"
    """``--uplink-obs``: ``fp32`` rounds a rollout's float64 observations (MuJoCo's) to float32 on the worker
    before its policy acts on them, so that the learner trains on the very values the policy saw, in half the
    bytes (float32 observations are left as they are); ``exact`` keeps the env's dtype; a lossy low-bit code
    (``fp16``, ``bf16``, ``int8``, ``int16``: their errors in :mod:`frugalrl.wire.transforms`) rounds those float32
    observations further on the wire only, followed by the compressor (not ``none``)."""
    behaviour: Behaviour = "recompute"
    """``--uplink-behaviour``: what the learner's losses (PPO's ratio, V-trace's ratios) and AAPS's KL estimate
    need of the policy a worker acted with (:class:`frugalrl.sync_state.PolicySync`). ``recompute`` sends nothing:
    the head, which keeps the words each worker holds, recomputes each taken action's log-probability (the same
    function of the same inputs; the workers send it where the head lacks their words, after a resume);
    ``logprob`` sends that log-probability; ``params`` the full distribution parameters."""
    link_mbps: float = 100.0
    """The link rate ``auto`` assumes when it weighs a codec's CPU time against the time its saving takes off the
    link."""

    def __post_init__(self) -> None:
        if self.compressor not in UPLINK_OPTIONS:
            raise ValueError(f"unknown uplink {self.compressor!r}; expected one of {UPLINK_OPTIONS}")
        if self.obs not in OBS_CODECS:
            raise ValueError(f"unknown uplink_obs {self.obs!r}; expected one of {OBS_CODECS}")
        if self.behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown uplink_behaviour {self.behaviour!r}; expected one of {BEHAVIOURS}")
        if not (isinstance(self.link_mbps, int | float) and math.isfinite(self.link_mbps) and self.link_mbps > 0):
            raise ValueError(f"uplink_link_mbps must be a positive number, got {self.link_mbps!r}")
        if self.obs in LOSSY_OBS and self.compressor == "none":
            raise ValueError(f"uplink_obs {self.obs!r} needs a compressor: use uplink 'auto', 'lz4' or 'zstd'")

    @property
    def obs_dtype(self) -> np.dtype | None:
        """The dtype a rollout's float64 observations take on the worker (None: the env's)."""
        return None if self.obs == "exact" else np.dtype(np.float32)

    def to_json(self) -> dict[str, Any]:
        """The options as a JSON dict (:meth:`from_json` reads it back)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | str | UplinkOptions) -> UplinkOptions:
        """Options from :meth:`to_json`'s dict, a compressor name alone, or options."""
        if isinstance(data, UplinkOptions):
            return data
        if isinstance(data, str):
            return cls(compressor=data)  # type: ignore[arg-type]
        return cls(**data)


@dataclass
class _Probe:
    """What ``auto`` measured for one stream: its smallest codec, encode seconds and bytes saved per message (last
    probe)."""

    seconds: float = 0.0
    saved: int = 0
    on: bool = True
    codec: str = ""
    candidates: list[str] = field(default_factory=list)


@dataclass
class UplinkCodecs:
    """Picks each reply's stream codecs for one worker (stateful under ``auto``: it measures)."""

    options: UplinkOptions
    probes: dict[str, _Probe] = field(default_factory=dict)
    messages: int = 0

    def codecs(self, arrays: dict[str, np.ndarray]) -> dict[str, str]:
        """The codec of each stream of a reply (streams left out travel raw)."""
        opt = self.options
        out: dict[str, str] = {}
        if opt.compressor == "none":
            return out
        compressor = AUTO_CODEC if opt.compressor == "auto" else opt.compressor
        probe_now = self.messages % PROBE_EVERY == 0
        self.messages += 1
        for name in UPLINK_STREAMS:
            arr = arrays.get(name)
            if arr is None:
                continue
            if arr.nbytes < MIN_COMPRESS_NBYTES:
                if arr.dtype.kind == "b":
                    out[name] = "bits"
                continue
            codec = _stream_codec(name, arr, compressor, opt.obs)
            lossy = codec.split("+")[0] in LOSSY_OBS
            if opt.compressor != "auto" or lossy:
                out[name] = codec  # asked for: always on (a lossy code is the user's choice, not a speed-up)
                continue
            candidates = _candidates(name, arr, codec, compressor)
            probe = self.probes.get(name)
            fresh = probe is None or probe.candidates != candidates  # a new stream, or another kind (a reset's obs)
            if probe is None or fresh:
                probe = self.probes[name] = _Probe(candidates=candidates)
            if probe_now or fresh:  # the smallest candidate, timed by the faster of two encodings (the first may pay setup)
                measured = []
                for candidate in candidates:
                    times = []
                    for _ in range(2):
                        started = time.perf_counter()
                        size = len(_codecs.encode(arr, candidate))
                        times.append(time.perf_counter() - started)
                    measured.append((size, min(times), candidate))
                # by size alone: of equal sizes the first (the plain codec), not whichever the clock favoured this time
                size, probe.seconds, probe.codec = min(measured, key=lambda m: m[0])
                probe.saved = arr.nbytes - size
                link_s = probe.saved * 8 / (opt.link_mbps * 1e6)
                probe.on = probe.saved > 0 and 2 * probe.seconds < link_s
            if probe.on:
                out[name] = probe.codec
            elif arr.dtype.kind == "b":
                out[name] = "bits"
        return out

    def report(self) -> dict[str, Any]:
        """Options and, under ``auto``, each stream's last measurement."""
        out: dict[str, Any] = self.options.to_json()
        if self.probes:
            out["probes"] = {name: {"codec": p.codec, "encode_us": round(p.seconds * 1e6, 1), "saved_bytes": p.saved,
                                    "on": p.on}
                             for name, p in self.probes.items()}
        return out


def _stream_codec(name: str, arr: np.ndarray, compressor: str, obs: str) -> str:
    """The codec a compressible stream gets: a transform (frames, low-bit) then the compressor, or the
    compressor alone."""
    if name in OBS_STREAMS and obs in LOSSY_OBS and arr.dtype == np.float32:
        return f"{obs}+{compressor}"
    if name == "obs" and arr.dtype == np.uint8 and arr.ndim >= 5 and arr.shape[2] >= 2:
        return f"frames+{compressor}"
    return compressor


def _candidates(name: str, arr: np.ndarray, codec: str, compressor: str) -> list[str]:
    """The codecs ``auto`` weighs for a stream: its codec, and for a rollout of float observations also the
    ``steps`` transform (smaller on physical states, larger on 0/1 grids: measured, not assumed)."""
    if codec == compressor and name == "obs" and arr.dtype.kind == "f" and arr.ndim >= 3 and arr.shape[0] >= 2:
        return [codec, f"steps+{compressor}"]
    return [codec]
