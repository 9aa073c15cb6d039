"""_arrays: numpy arrays and torch tensors as ckpt tensors, and back.

Design note. A leaf of the saved state becomes one ckpt tensor whose data
pointer is the array's own memory: ckpt_save copies it into the staging
pool, so nothing is copied in Python (torch.bfloat16 goes as bf16 from
data_ptr(), never through f32). Copies happen only where the memory cannot
be handed over as it is, one each: a non-contiguous array or tensor (made
contiguous), a numeric numpy array in non-native byte order (byte-swapped;
restored in its original order), a tensor with the conjugate or negative
bit set (resolved), a tensor off the CPU (moved; restored on the CPU).

Each leaf is described in the tree (see _tree.py) by its kind ("numpy",
"torch", "npscalar", "bytes", "bytearray"), its original dtype and shape,
and how it is stored. What ckpt has no dtype for is stored in a dtype it
has, and the tree says how to read it back:
  complex (numpy c8/c16, torch complex32/64/128): float pairs, the stored
    shape gains a last dimension of 2 ("pairs": true);
  numpy datetime64 / timedelta64: i64 (the unit is in the dtype string);
  numpy longdouble, clongdouble, bytes (S), str (U), void and structured
    dtypes: raw bytes, u8 with a last dimension of the item size ("raw").
  numpy extension dtypes of ml_dtypes (bfloat16, float8_e4m3fn,
    float8_e5m2: JAX host arrays) as bf16 / f8 (restoring needs ml_dtypes);
  torch quantized tensors (per-tensor affine): their integers (packed for
    quint4x2 / quint2x4) with scale and zero point in the tree.
Object arrays (and structured dtypes holding objects) raise TypeError.
Other objects with the buffer protocol or __array__ (memoryview,
array.array, a JAX array: its host copy) are saved through np.asarray and
come back as numpy arrays; bytes and bytearray come back as themselves.
restore allocates np.empty / torch.empty of the exact dtype and shape and
the reader writes straight into it.
"""

import array

import numpy as np

from . import _lib

try:  # torch is optional: numpy-only users never import it
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

_NP_INT = {("b", 1): "bool", ("i", 1): "i8", ("i", 2): "i16", ("i", 4): "i32",
           ("i", 8): "i64", ("u", 1): "u8", ("u", 2): "u16", ("u", 4): "u32",
           ("u", 8): "u64", ("f", 2): "f16", ("f", 4): "f32", ("f", 8): "f64",
           ("c", 8): "f32", ("c", 16): "f64", ("M", 8): "i64",
           ("m", 8): "i64"}

_ML_DTYPES = {"bfloat16": "bf16", "float8_e4m3fn": "f8e4m3",
              "float8_e5m2": "f8e5m2"}
_TORCH = {}  # torch dtype -> (stored ckpt dtype name, pairs)
if torch is not None:
    for _n, _s, _p in [("bool", "bool", 0), ("uint8", "u8", 0),
                       ("int8", "i8", 0), ("int16", "i16", 0),
                       ("int32", "i32", 0), ("int64", "i64", 0),
                       ("uint16", "u16", 0), ("uint32", "u32", 0),
                       ("uint64", "u64", 0), ("float16", "f16", 0),
                       ("bfloat16", "bf16", 0), ("float32", "f32", 0),
                       ("float64", "f64", 0), ("complex32", "f16", 1),
                       ("complex64", "f32", 1), ("complex128", "f64", 1),
                       ("float8_e4m3fn", "f8e4m3", 0),
                       ("float8_e5m2", "f8e5m2", 0)]:
        if isinstance(getattr(torch, _n, None), torch.dtype):
            _TORCH[getattr(torch, _n)] = (_s, _p)
    _TORCH_NAME = {d: str(d).replace("torch.", "") for d in _TORCH}
    _QUANT = {getattr(torch, n) for n in ("quint8", "qint8", "qint32",
                                          "quint4x2", "quint2x4")
              if hasattr(torch, n)}


class Leaf:
    """One array leaf ready to save: meta goes into the tree; ptr/nbytes
    point at memory kept alive by `keep` until the save returns."""

    __slots__ = ("meta", "dtype", "shape", "ptr", "nbytes", "keep")

    def __init__(self, meta, dtype, shape, ptr, nbytes, keep):
        self.meta, self.dtype, self.shape = meta, dtype, shape
        self.ptr, self.nbytes, self.keep = ptr, nbytes, keep


def _np_dtype_desc(dt):
    return np.lib.format.dtype_to_descr(dt)


def _descr(d):
    """A dtype description back from JSON (numpy's descr uses tuples)."""
    if isinstance(d, str):
        return d
    out = []
    for f in d:
        name = tuple(f[0]) if isinstance(f[0], list) else f[0]
        out.append((name, _descr(f[1])) + tuple(tuple(x) for x in f[2:]))
    return out


def _np_dtype(desc):
    if isinstance(desc, str) and desc.startswith("ml_dtypes."):
        import ml_dtypes  # what wrote it had it
        return np.dtype(getattr(ml_dtypes, desc[len("ml_dtypes."):]))
    return np.lib.format.descr_to_dtype(_descr(desc))


def _numpy_leaf(a, kind, path):
    dt = a.dtype
    if dt.hasobject:
        raise TypeError("ckpt: %s: numpy arrays of Python objects (dtype %s)"
                        " cannot be saved" % (path, dt))
    if dt.kind == "V" and dt.type is not np.void:
        return _extension_leaf(a, kind, path)
    meta = {"kind": kind, "dtype": _np_dtype_desc(dt),
            "shape": list(a.shape)}
    shape = a.shape
    stored = _NP_INT.get((dt.kind, dt.itemsize)) if dt.fields is None else None
    if stored is None:  # longdouble, S, U, V, structured: raw bytes
        stored = "u8"
        shape = shape + (dt.itemsize,)
        meta["raw"] = True
    else:
        if not dt.isnative:
            a = a.astype(dt.newbyteorder("="))
        if dt.kind == "c":
            shape = shape + (2,)
            meta["pairs"] = True
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    meta["store"] = stored
    return Leaf(meta, _lib.DTYPES[stored], shape, a.ctypes.data, a.nbytes, a)


def _extension_leaf(a, kind, path):
    """ml_dtypes' bfloat16 / float8 (JAX host arrays: jax.device_get)
    as ckpt's own dtypes; other extension dtypes are refused."""
    stored = _ML_DTYPES.get(a.dtype.name)
    if stored is None or _lib.DTYPE_SIZE[stored] != a.dtype.itemsize:
        raise TypeError("ckpt: %s: numpy extension dtype %s cannot be saved"
                        % (path, a.dtype))
    a = np.ascontiguousarray(a)
    meta = {"kind": kind, "dtype": "ml_dtypes." + a.dtype.name,
            "shape": list(a.shape), "store": stored}
    return Leaf(meta, _lib.DTYPES[stored], a.shape, a.ctypes.data, a.nbytes,
                a)


def _torch_leaf(t, path):
    info = _TORCH.get(t.dtype)
    if (info is not None and not info[1] and type(t) is torch.Tensor
            and t.layout == torch.strided and not t.requires_grad
            and t.is_cpu and not t.is_neg() and t.is_contiguous()):
        # the common case, kept short: a plain dense CPU tensor
        shape = tuple(t.shape)
        return Leaf({"kind": "torch", "dtype": _TORCH_NAME[t.dtype],
                     "shape": list(shape), "store": info[0]},
                    _lib.DTYPES[info[0]], shape, t.data_ptr(),
                    t.numel() * t.element_size(), t)
    meta = {"kind": "torch", "dtype": _TORCH_NAME.get(t.dtype) or str(
        t.dtype).replace("torch.", ""), "shape": list(t.shape)}
    if t.layout != torch.strided:
        raise TypeError("ckpt: %s: torch tensors with layout %s cannot be "
                        "saved (only dense ones)" % (path, t.layout))
    if isinstance(t, torch.nn.Parameter):
        meta["param"] = True
    if t.requires_grad:
        meta["requires_grad"] = True
    t = t.detach()
    if t.device.type != "cpu":
        meta["device"] = str(t.device)
        t = t.cpu()
    if t.is_quantized:
        if t.dtype not in _QUANT or t.qscheme() != torch.per_tensor_affine:
            raise TypeError("ckpt: %s: quantized tensors of dtype %s and "
                            "scheme %s cannot be saved" % (path, t.dtype,
                                                           t.qscheme()))
        # the integers (packed for quint4x2 / quint2x4) as stored
        meta["scale"] = float(t.q_scale())
        meta["zero_point"] = int(t.q_zero_point())
        t = t.int_repr()
        meta["qshape"] = list(t.shape)
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype not in _TORCH:
        raise TypeError("ckpt: %s: torch dtype %s cannot be saved"
                        % (path, t.dtype))
    stored, pairs = _TORCH[t.dtype]
    shape = tuple(t.shape)
    if pairs:
        shape += (2,)
        meta["pairs"] = True
    if not t.is_contiguous():
        t = t.contiguous()
    meta["store"] = stored
    nbytes = t.numel() * t.element_size()
    return Leaf(meta, _lib.DTYPES[stored], shape, t.data_ptr(), nbytes, t)


def leaf(x, path):
    """A Leaf for an array-like x, or None when x is not one."""
    if isinstance(x, np.ndarray):
        return _numpy_leaf(x, "numpy", path)
    if isinstance(x, np.generic):
        return _numpy_leaf(np.asarray(x), "npscalar", path)
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_leaf(x, path)
    if isinstance(x, (bytes, bytearray)):
        a = np.frombuffer(x, dtype=np.uint8)
        lf = _numpy_leaf(a, type(x).__name__, path)
        del lf.meta["dtype"]
        return lf
    if isinstance(x, (memoryview, array.array)) or \
            hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return _numpy_leaf(np.asarray(x), "numpy", path)
    return None


def alloc(meta):
    """An empty destination for a leaf: (object to return later, pointer,
    nbytes, finish) where finish(obj) gives the value restored."""
    kind, shape = meta["kind"], tuple(meta["shape"])
    if kind == "torch":
        if torch is None:
            raise ImportError("ckpt: the checkpoint holds torch tensors "
                              "but torch cannot be imported")
        dt = getattr(torch, meta["dtype"])
        if "scale" in meta:
            t = torch._empty_affine_quantized(
                shape, scale=meta["scale"], zero_point=meta["zero_point"],
                dtype=dt)
            nbytes = _lib.DTYPE_SIZE[meta["store"]]
            for d in meta["qshape"]:
                nbytes *= d
        else:
            t = torch.empty(shape, dtype=dt)
            nbytes = t.numel() * t.element_size()
        return t, t.data_ptr(), nbytes, lambda v: _torch_finish(v, meta)
    if kind in ("bytes", "bytearray"):
        a = bytearray(shape[0])
        buf = (_lib.c_u8 * len(a)).from_buffer(a) if a else None
        ptr = _lib.ctypes.addressof(buf) if buf is not None else None
        return a, ptr, len(a), bytes if kind == "bytes" else (lambda v: v)
    dt = _np_dtype(meta["dtype"])
    a = np.empty(shape, dtype=dt if dt.isnative or meta.get("raw")
                 or dt.fields is not None else dt.newbyteorder("="))
    fin = (lambda v: v.astype(dt)) if a.dtype != dt else (lambda v: v)
    if kind == "npscalar":
        return a, a.ctypes.data, a.nbytes, lambda v: fin(v)[()]
    return a, a.ctypes.data, a.nbytes, fin


def reuse(meta, x):
    """x as the destination of a saved leaf, written in place: (x,
    pointer, nbytes, finish) when x is a dense, C-contiguous, writable CPU
    tensor or numpy array of exactly the saved dtype and shape, else None
    (the leaf is then allocated anew)."""
    kind, shape = meta["kind"], tuple(meta["shape"])
    if kind == "torch" and torch is not None and \
            isinstance(x, torch.Tensor):
        if ("scale" in meta or x.layout != torch.strided or not x.is_cpu
                or x.is_quantized or x.is_neg() or x.is_conj()
                or _TORCH_NAME.get(x.dtype) != meta["dtype"]
                or tuple(x.shape) != shape or not x.is_contiguous()
                or _TORCH[x.dtype][1]):
            return None
        return x, x.data_ptr(), x.numel() * x.element_size(), _same
    if kind == "numpy" and type(x) is np.ndarray:
        if (meta.get("raw") or meta.get("pairs") or x.dtype.fields is not None
                or not x.dtype.isnative or not x.flags.c_contiguous
                or not x.flags.writeable or x.shape != shape
                or x.dtype != _np_dtype(meta["dtype"])):
            return None
        return x, x.ctypes.data, x.nbytes, _same
    return None


def _same(v):
    return v


def _torch_finish(t, meta):
    if meta.get("param"):
        return torch.nn.Parameter(t, requires_grad=bool(
            meta.get("requires_grad")))
    if meta.get("requires_grad"):
        t.requires_grad_(True)
    return t


def plain(dtype, shape):
    """Destination for a tensor saved without a tree (by C code): numpy of
    the matching dtype; bf16 / f8 as torch when torch is importable, else
    as their raw unsigned integers."""
    name = _lib.DTYPE_NAMES.get(dtype, "u8")
    special = {"bf16": ("bfloat16", np.uint16),
               "f8e4m3": ("float8_e4m3fn", np.uint8),
               "f8e5m2": ("float8_e5m2", np.uint8)}
    if name in special:
        tname, npdt = special[name]
        if torch is not None and hasattr(torch, tname):
            t = torch.empty(shape, dtype=getattr(torch, tname))
            return t, t.data_ptr(), t.numel() * t.element_size()
        a = np.empty(shape, dtype=npdt)
        return a, a.ctypes.data, a.nbytes
    npdt = {"bool": "?", "f16": "f2", "f32": "f4", "f64": "f8"}.get(name)
    if npdt is None:  # u8 -> u1, i64 -> i8: numpy counts bytes
        npdt = "%s%d" % (name[0], int(name[1:]) // 8)
    a = np.empty(shape, dtype=npdt)
    return a, a.ctypes.data, a.nbytes
