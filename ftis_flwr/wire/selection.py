"""Cut a payload down to some of its groups without decoding it: the server's side of a budget.

Why apart from :mod:`ftis_flwr.wire.rollouts`: the strategy forwards groups it cannot score (no
model, no tokenizer), so it needs only the payload's structure: which bytes belong to which
group. This module reads that structure for each wire format it knows (``format_version`` in the
meta) and refuses any other loudly (:class:`WireSelectError`), so a new codec cannot be cut
wrongly by an old reader. Nothing here checks token ids or log-probs: the receiver still
validates everything it gets (:func:`ftis_flwr.wire.rollouts.decode_groups`).

Format 1 (see :mod:`ftis_flwr.wire.arrays`): flat arrays ``prompt_ids`` / ``completion_ids`` /
``logprobs`` / ``rewards`` with ``prompt_offsets`` [n+1], ``group_offsets`` [n+1] (completion
ranges) and ``completion_offsets`` [c+1] (token ranges); per-group lists of str in the meta.

Format 2 (compact, :mod:`ftis_flwr.wire.compact`): one container, unpacked structurally (caps
from the server's ``wire`` config checked first), cut, and packed again with the sender's own id
width, log-prob codec and compression, so the receiver gets exactly the bytes of those groups
(a 16-bit log-prob decodes to float32 and packs back to the same 16 bits).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from ftis_flwr.config.schema import WireConfig
from ftis_flwr.wire import compact as wc
from ftis_flwr.wire.groups import PayloadError
from ftis_flwr.wire.rollouts import WIRE_KEY, _compact_bytes, check_fields, payload_size, read_payload

FORMATS = (1, 2)
"""The ``format_version`` values this module can cut."""
_V1_ARRAYS = ("prompt_ids", "prompt_offsets", "completion_ids", "completion_offsets",
              "group_offsets", "logprobs", "rewards")
_TEXT_ARRAYS = ("text", "byte_lengths")
"""Present together or not at all (cross-tokenizer payloads): cut per completion like the rest."""
_MASK = "sampled"
"""Episodes' sampled masks (one entry per completion token), cut per completion like the rest."""


def _optional(has) -> tuple[str, ...]:
    """The optional arrays a payload holds (``has(key)``), in their order."""
    return (_TEXT_ARRAYS if has("text") else ()) + ((_MASK,) if has(_MASK) else ())


class WireSelectError(ValueError):
    """A payload this module cannot cut: unknown format, or a structure that does not add up."""


def _v1(arrays: ArrayRecord, meta: ConfigRecord) -> tuple[dict[str, np.ndarray], int]:
    """Format 1's arrays as numpy, in their wire dtypes (a cut keeps them), and the group count;
    only after :func:`ftis_flwr.wire.rollouts.read_payload` has checked keys, dtypes and offsets."""
    keys = _V1_ARRAYS + _optional(lambda k: k in arrays.keys())
    return {k: arrays[k].numpy() for k in keys}, len(meta["prompt_id"])


def _v2(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig
        ) -> tuple[dict[str, np.ndarray], int, dict, wc.Fields]:
    """A compact payload's sections as format 1's arrays, its group count, header and fields."""
    try:
        blob = _compact_bytes(arrays, meta, wire)
        header = wc.read_header(blob)
        f = wc.unpack(blob, wire)
    except PayloadError as exc:
        raise WireSelectError(f"compact payload cannot be read: {exc}") from None
    a = {k: getattr(f, k) for k in _V1_ARRAYS + _optional(lambda k: getattr(f, k) is not None)}
    return a, len(f.group_offsets) - 1, header, f


def _read(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig | None):
    """Either format's arrays, group count and (format 2) header, after the receivers' own
    structural checks (:func:`ftis_flwr.wire.rollouts.read_payload`): what the server cuts or ranks is
    never something a receiver would refuse to read."""
    wire = wire or WireConfig()
    if WIRE_KEY in arrays.keys():
        a, n, header, f = _v2(arrays, meta, wire)
        try:
            check_fields(f, wire)
        except PayloadError as exc:
            raise WireSelectError(f"compact payload rejected: {exc}") from None
        return a, n, (header, f)
    version = meta.get("format_version")
    if version not in FORMATS:
        raise WireSelectError(f"format_version {version!r} cannot be cut by ftis_flwr.wire.selection, which "
                              f"reads format(s) {', '.join(map(str, FORMATS))}")
    try:
        read_payload(arrays, meta, wire)
    except PayloadError as exc:
        raise WireSelectError(f"format 1 payload rejected: {exc}") from None
    a, n = _v1(arrays, meta)
    return a, n, None


def group_count(arrays: ArrayRecord, meta: ConfigRecord) -> int:
    """Groups a payload claims, read without decoding (either format); 0 when unreadable."""
    try:
        return payload_size(arrays, meta)[0]
    except Exception:  # whatever a node sent: it is counted as nothing, never a crash
        return 0


class Cuttable:
    """A payload read once (either format): its group count, its claimed rewards, and cuts of it.
    The strategy reads each source's payload once per round and cuts it for every receiver."""

    def __init__(self, arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig | None = None):
        self.arrays, self.meta = arrays, meta
        self._a, self.n, self._compact = _read(arrays, meta, wire)

    def rewards(self) -> list[np.ndarray]:
        """Each group's rewards *as the sender claims them* (receivers recompute their own)."""
        g_off = self._a["group_offsets"]
        return [self._a["rewards"][g_off[g]:g_off[g + 1]].astype(np.float32) for g in range(self.n)]

    def subset(self, keep: list[int]) -> tuple[ArrayRecord, ConfigRecord]:
        """The same payload with only groups ``keep`` (positions, kept in payload order).

        Format 1: dtypes are unchanged and every per-group meta list (a list as long as the
        groups) is cut alike; other meta entries are copied. Format 2: packed again as the sender
        packed it. ``keep`` out of range or repeated is a ValueError.
        """
        a, n = self._a, self.n
        keep = sorted(int(k) for k in keep)
        if len(set(keep)) != len(keep) or (keep and not 0 <= keep[0] <= keep[-1] < n):
            raise ValueError(f"keep must be distinct group positions in [0, {n}), got {keep}")
        p_off, g_off, c_off = a["prompt_offsets"], a["group_offsets"], a["completion_offsets"]
        comps = [c for g in keep for c in range(g_off[g], g_off[g + 1])]

        def cut(flat: np.ndarray, ranges) -> np.ndarray:
            return wc.flat([flat[lo:hi] for lo, hi in ranges], flat.dtype)

        def offsets(lengths) -> np.ndarray:
            return wc.offsets(np.asarray(lengths, dtype=np.int64)).astype(p_off.dtype, copy=False)

        tokens = [(c_off[c], c_off[c + 1]) for c in comps]
        out = {
            "prompt_ids": cut(a["prompt_ids"], [(p_off[g], p_off[g + 1]) for g in keep]),
            "prompt_offsets": offsets([p_off[g + 1] - p_off[g] for g in keep]),
            "completion_ids": cut(a["completion_ids"], tokens),
            "completion_offsets": offsets([hi - lo for lo, hi in tokens]),
            "group_offsets": offsets([g_off[g + 1] - g_off[g] for g in keep]),
            "logprobs": cut(a["logprobs"], tokens),
            "rewards": a["rewards"][np.asarray(comps, dtype=np.int64)],
        }
        if "text" in a:
            at = wc.offsets(a["byte_lengths"])  # byte position of each token's start
            out["byte_lengths"] = cut(a["byte_lengths"], tokens)
            out["text"] = cut(a["text"], [(at[lo], at[hi]) for lo, hi in tokens])
        if _MASK in a:
            out[_MASK] = cut(a[_MASK], tokens)
        return _repack(self, out, [self._per_group(g) for g in keep])

    def _per_group(self, g: int) -> dict[str, object]:
        """Group ``g``'s per-group strings (format 2) or per-group meta entries (format 1)."""
        if self._compact is not None:
            return {k: v[g] for k, v in self._compact[1].strings.items()}
        return {k: v[g] for k, v in self.meta.items() if isinstance(v, list) and len(v) == self.n}


def _repack(like: Cuttable, out: dict[str, np.ndarray], per_group: list[dict[str, object]]
            ) -> tuple[ArrayRecord, ConfigRecord]:
    """Arrays ``out`` (format 1's names) + per-group entries, packed as ``like`` was packed."""
    if like._compact is not None:
        header, f = like._compact
        strings = {k: [str(pg[k]) for pg in per_group] for k in f.strings}
        blob = wc.pack(wc.Fields(strings=strings, **{k: np.asarray(v) for k, v in out.items()}),
                       id_bits=header["id_bits"], codec=header["codec"],
                       compress="zlib" if header["zlib"] else "none")
        return (ArrayRecord({WIRE_KEY: Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8))}),
                ConfigRecord(dict(like.meta.items())))
    new_meta = {}
    for key, value in like.meta.items():
        per = isinstance(value, list) and len(value) == like.n
        new_meta[key] = [pg[key] for pg in per_group] if per else value
    return (ArrayRecord({k: Array.from_numpy_ndarray(v) for k, v in out.items()}), ConfigRecord(new_meta))


def merge(reads: list[Cuttable]) -> tuple[ArrayRecord, ConfigRecord]:
    """One payload holding every group of ``reads`` in order: several payloads of *one* source
    (the asynchronous schedule forwards a fast source's rounds together), packed as the first
    was. Payloads that differ in format, dtypes, per-group keys or (format 2) id width, codec or
    compression cannot be joined: WireSelectError (the strategy then forwards the newest alone)."""
    if not reads:
        raise ValueError("merge needs at least one payload")
    if len(reads) == 1:
        return reads[0].arrays, reads[0].meta
    first = reads[0]

    def shape(r: Cuttable) -> tuple:
        head = None if r._compact is None else tuple(r._compact[0][k] for k in ("id_bits", "codec", "zlib"))
        keys = tuple(sorted(r._per_group(0))) if r.n else None
        return head, tuple(r._a[k].dtype.str for k in _V1_ARRAYS), keys, "text" in r._a, _MASK in r._a

    shapes = {shape(r) for r in reads if r.n}
    if len(shapes) > 1:
        raise WireSelectError(f"payloads of one source cannot be joined: they were packed differently "
                              f"({sorted(map(str, shapes))})")
    like = next((r for r in reads if r.n), first)
    used = [r for r in reads if r.n] or [first]  # an empty payload adds nothing (may lack text)
    out = {}
    for key in ("prompt_ids", "completion_ids", "logprobs", "rewards") + _optional(lambda k: k in like._a):
        out[key] = np.concatenate([r._a[key] for r in used]).astype(like._a[key].dtype, copy=False)
    for key in ("prompt_offsets", "completion_offsets", "group_offsets"):
        lengths = np.concatenate([np.diff(r._a[key]) for r in used]).astype(np.int64)
        out[key] = wc.offsets(lengths).astype(like._a[key].dtype, copy=False)
    return _repack(like, out, [r._per_group(g) for r in reads for g in range(r.n)])


def group_rewards(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig | None = None
                  ) -> list[np.ndarray]:
    """Each group's rewards *as the sender claims them* (see :class:`Cuttable`)."""
    return Cuttable(arrays, meta, wire).rewards()


def subset_payload(arrays: ArrayRecord, meta: ConfigRecord, keep: list[int],
                   wire: WireConfig | None = None) -> tuple[ArrayRecord, ConfigRecord]:
    """The same payload with only groups ``keep`` (see :meth:`Cuttable.subset`)."""
    return Cuttable(arrays, meta, wire).subset(keep)
