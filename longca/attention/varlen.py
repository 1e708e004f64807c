"""Document lengths for packed ("varlen") masks.

A packed sequence of ``seqlen`` tokens is split into documents whose lengths are drawn from a
length histogram and sum exactly to ``seqlen``: documents are drawn until the total reaches
``seqlen`` and the last one is truncated to fit (truncation, not resampling, so the documents
drawn before it stay the same whatever ``seqlen`` is; the price is one short last document).

Reproducibility: every draw comes from ``numpy.random.Generator(PCG64(SeedSequence(seed, ...)))``
and only through ``Generator.random`` (uniform doubles, ``(uint64 >> 11) * 2**-53``).  Bin choice,
length inside the bin and shuffles are computed here from those doubles, so the documents do not
depend on how a numpy release implements ``integers``/``choice``/``shuffle`` — the same seed gives
the same documents on every machine.

A histogram is a list of bins ``[lo, hi)`` of integer lengths with a non-negative weight each: the
probability that a document's length falls in the bin (per document, not per token).  Inside a
bin the length is uniform.  Files are JSON ``{"edges": [e0, ..., en], "weights": [w1, ..., wn]}``
(contiguous bins) or CSV with a ``lo,hi,weight`` header (one bin per row; gaps allowed).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np

from longca.attention.errors import MaskError

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_HISTOGRAM_PATH = DATA_DIR / "doclen_default.json"

# Independent random streams per purpose, so that e.g. passing ``prefix=`` explicitly does not
# change the documents drawn for the same seed.
STREAM_DOCS, STREAM_LONG, STREAM_SHUFFLE, STREAM_PARAMS = 0, 1, 2, 3

# The long-document mixture of the ``*_long`` patterns.
LONG_FRACTION = 0.6
LONG_MIN = 8 * 1024
LONG_MAX = 30 * 1024


@dataclass(frozen=True)
class Histogram:
    """Bins ``[lo[k], hi[k])`` of integer document lengths with weights (normalised on use)."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    weights: tuple[float, ...]
    name: str = "custom"

    def __post_init__(self) -> None:
        n = len(self.weights)
        if n == 0:
            raise MaskError(f"histogram {self.name!r}: no bins (weights is empty)")
        if len(self.lo) != n or len(self.hi) != n:
            raise MaskError(f"histogram {self.name!r}: bins and weights differ in length "
                            f"({len(self.lo)} bins, {n} weights)")
        for k, (lo, hi, w) in enumerate(zip(self.lo, self.hi, self.weights)):
            if not (_is_int(lo) and _is_int(hi)):
                raise MaskError(f"histogram {self.name!r}: bin {k} edges must be integers, "
                                f"got [{lo!r}, {hi!r})")
            if lo < 1:
                raise MaskError(f"histogram {self.name!r}: bin {k} starts at {lo}; "
                                "document lengths are >= 1")
            if hi <= lo:
                raise MaskError(f"histogram {self.name!r}: bins not increasing: bin {k} is "
                                f"[{lo}, {hi})")
            if k and lo < self.hi[k - 1]:
                raise MaskError(f"histogram {self.name!r}: bins not increasing: bin {k} "
                                f"[{lo}, {hi}) starts before bin {k - 1} ends at {self.hi[k - 1]}")
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w):
                raise MaskError(f"histogram {self.name!r}: weight of bin {k} is not a finite "
                                f"number: {w!r}")
            if w < 0:
                raise MaskError(f"histogram {self.name!r}: negative weight {w} in bin {k}")
        if sum(self.weights) <= 0:
            raise MaskError(f"histogram {self.name!r}: no weight (all weights are zero)")

    @classmethod
    def from_edges(cls, edges: Sequence[int], weights: Sequence[float], name: str = "custom"
                   ) -> "Histogram":
        if len(edges) != len(weights) + 1:
            raise MaskError(f"histogram {name!r}: need len(edges) == len(weights) + 1, got "
                            f"{len(edges)} edges and {len(weights)} weights")
        return cls(tuple(edges[:-1]), tuple(edges[1:]), tuple(weights), name)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], name: str = "inline") -> "Histogram":
        name = str(data.get("name", name))
        if {"lo", "hi", "weights"} <= set(data):  # the as_dict() form (bins may have gaps)
            return cls(tuple(data["lo"]), tuple(data["hi"]), tuple(data["weights"]), name)
        if "edges" not in data or "weights" not in data:
            raise MaskError(f"histogram {name!r}: needs keys 'edges' and 'weights' (or 'lo', "
                            f"'hi' and 'weights'), got {sorted(data)}")
        return cls.from_edges(list(data["edges"]), list(data["weights"]), name)

    def mean(self) -> float:
        w = np.asarray(self.weights, dtype=np.float64)
        lo, hi = np.asarray(self.lo, dtype=np.float64), np.asarray(self.hi, dtype=np.float64)
        mid = (lo + hi - 1) / 2  # mean of the integers lo .. hi - 1
        return float((w * mid).sum() / w.sum())

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "lo": list(self.lo), "hi": list(self.hi),
                "weights": list(self.weights)}


HistogramSpec = Union[None, str, Path, Mapping[str, Any], Histogram]


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def load_histogram(path: str | Path) -> Histogram:
    """Read a histogram from JSON (``edges``/``weights``) or CSV (``lo,hi,weight`` rows)."""
    p = Path(path)
    if not p.is_file():
        raise MaskError(f"histogram: file not found: {str(path)!r}")
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise MaskError(f"histogram {str(path)!r}: invalid JSON: {exc}") from exc
        if not isinstance(data, Mapping):
            raise MaskError(f"histogram {str(path)!r}: expected a JSON object with 'edges' and "
                            "'weights'")
        return Histogram.from_mapping(data, name=str(path))
    if p.suffix.lower() == ".csv":
        return _load_csv(p)
    raise MaskError(f"histogram {str(path)!r}: unknown format; use .json or .csv")


def _load_csv(p: Path) -> Histogram:
    with p.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise MaskError(f"histogram {str(p)!r}: no bins (empty CSV)")
    missing = {"lo", "hi", "weight"} - set(rows[0])
    if missing:
        raise MaskError(f"histogram {str(p)!r}: CSV needs columns lo,hi,weight; missing "
                        f"{sorted(missing)}")
    try:
        lo = tuple(int(r["lo"]) for r in rows)
        hi = tuple(int(r["hi"]) for r in rows)
        w = tuple(float(r["weight"]) for r in rows)
    except (TypeError, ValueError) as exc:
        raise MaskError(f"histogram {str(p)!r}: bad number in CSV: {exc}") from exc
    return Histogram(lo, hi, w, name=str(p))


DEFAULT_HISTOGRAM: Histogram = load_histogram(DEFAULT_HISTOGRAM_PATH)
DEFAULT_HISTOGRAM = Histogram(DEFAULT_HISTOGRAM.lo, DEFAULT_HISTOGRAM.hi,
                              DEFAULT_HISTOGRAM.weights, name="default")


def resolve_histogram(spec: HistogramSpec) -> Histogram:
    """``None`` → the default; a path → the file; a mapping → inline edges/weights."""
    if spec is None:
        return DEFAULT_HISTOGRAM
    if isinstance(spec, Histogram):
        return spec
    if isinstance(spec, (str, Path)):
        return load_histogram(spec)
    if isinstance(spec, Mapping):
        return Histogram.from_mapping(spec)
    raise MaskError(f"histogram must be a file path or a mapping with edges/weights, got "
                    f"{type(spec).__name__}")


def rng(seed: int, stream: int) -> np.random.Generator:
    """The generator for one purpose (``STREAM_*``) of one seed."""
    check_seed(seed)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(stream,))))


def check_seed(seed: Any) -> int:
    if not _is_int(seed) or seed < 0:
        raise MaskError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _check_total(name: str, value: Any, minimum: int = 1) -> int:
    if not _is_int(value) or value < minimum:
        raise MaskError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _draw(hist: Histogram, gen: np.random.Generator, total: int) -> list[int]:
    """Draw documents from ``hist`` until they reach ``total`` tokens; truncate the last."""
    if total == 0:
        return []
    lo = np.asarray(hist.lo, dtype=np.int64)
    width = np.asarray(hist.hi, dtype=np.int64) - lo
    cdf = np.cumsum(np.asarray(hist.weights, dtype=np.float64))
    # Draw in batches sized for the expected count; document k always uses doubles 2k and 2k+1
    # of the stream, so the batch size does not change the result.
    batch = max(16, int(total / hist.mean() * 1.25) + 16)
    lengths: list[np.ndarray] = []
    drawn = 0
    while drawn < total:
        u = gen.random((batch, 2))
        k = np.minimum(np.searchsorted(cdf, u[:, 0] * cdf[-1], side="right"), len(cdf) - 1)
        part = lo[k] + np.floor(u[:, 1] * width[k]).astype(np.int64)
        lengths.append(part)
        drawn += int(part.sum())
    docs = np.concatenate(lengths)
    cum = np.cumsum(docs)
    last = int(np.searchsorted(cum, total, side="left"))
    docs = docs[: last + 1].copy()
    docs[-1] -= int(cum[last]) - total
    return [int(x) for x in docs]


def sample_documents(seqlen: int, *, seed: int = 0, histogram: HistogramSpec = None
                     ) -> tuple[int, ...]:
    """Document lengths (each ≥ 1) summing to ``seqlen``, drawn from ``histogram``."""
    seqlen = _check_total("seqlen", seqlen)
    hist = resolve_histogram(histogram)
    return tuple(_draw(hist, rng(seed, STREAM_DOCS), seqlen))


def long_mixture(seqlen: int, *, seed: int = 0, histogram: HistogramSpec = None,
                 long_fraction: float = LONG_FRACTION, long_min: int = LONG_MIN,
                 long_max: int = LONG_MAX) -> tuple[int, ...]:
    """Documents for the ``*_long`` patterns.

    ``round(long_fraction * seqlen)`` tokens come from long documents of uniform length in
    ``[long_min, long_max]`` (the last truncated to fit), the rest from ``histogram``; the two
    lists are then shuffled together.  Below ``long_min / long_fraction`` tokens the "long" part is
    one truncated document, so small test sizes still exercise the code path.
    """
    seqlen = _check_total("seqlen", seqlen)
    if not isinstance(long_fraction, (int, float)) or isinstance(long_fraction, bool) \
            or not 0.0 <= long_fraction <= 1.0:
        raise MaskError(f"long_fraction must be a number in [0, 1], got {long_fraction!r}")
    long_min = _check_total("long_min", long_min)
    long_max = _check_total("long_max", long_max)
    if long_max < long_min:
        raise MaskError(f"long_max ({long_max}) must be >= long_min ({long_min})")
    hist = resolve_histogram(histogram)
    long_tokens = int(round(long_fraction * seqlen))
    long_hist = Histogram((long_min,), (long_max + 1,), (1.0,), name="long")
    docs = _draw(long_hist, rng(seed, STREAM_LONG), long_tokens)
    docs += _draw(hist, rng(seed, STREAM_DOCS), seqlen - long_tokens)
    order = np.argsort(rng(seed, STREAM_SHUFFLE).random(len(docs)), kind="stable")
    return tuple(docs[i] for i in order)


def check_documents(documents: Any, seqlen: int) -> tuple[int, ...]:
    """Validate an explicit ``documents=[...]`` list: positive integers summing to ``seqlen``."""
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence) \
            or len(documents) == 0:
        raise MaskError(f"documents must be a non-empty list of positive integers, got "
                        f"{documents!r}")
    for k, d in enumerate(documents):
        if not _is_int(d) or d < 1:
            raise MaskError(f"documents[{k}] must be a positive integer, got {d!r}")
    total = sum(int(d) for d in documents)
    if total != seqlen:
        raise MaskError(f"documents sum to {total}, not to seqlen {seqlen}")
    return tuple(int(d) for d in documents)
