"""_tree: a nested state as flat ckpt tensors plus one JSON tree.

Design note. save() takes any nesting of dict (and OrderedDict, with a
state_dict's `_metadata`), list and tuple around arrays, tensors and plain
values (None, bool, int, float, str, bytes). flatten() walks it once:

  state --flatten--> tree (JSON: structure, plain values, leaf metadata)
                     leaves [(name, Leaf)]  --> ckpt tensors (zero-copy)
  tree + restored leaves --unflatten--> state (same types)

Each array leaf is one tensor named by its path of keys joined by "/",
a key's "%" and "/" (and control characters) written %XX, so any key works
and `ckptctl ls/inspect` show readable names; a name that would collide
(keys 0 and "0" in one dict) or be too long gets a "~N" suffix. The tree
is saved beside them as the u8 tensor `__ckpt_tree__`:

  {"ckpt_tree": 1, "root": NODE}
  NODE: null | true | false | number | string      (the plain value)
      | {"t": "float", "v": "nan" | "inf" | "-inf"}
      | {"t": "dict" | "odict", "k": [NODE...], "v": [NODE...], "meta": NODE}
      | {"t": "list" | "tuple", "v": [NODE...]}
      | {"t": "torch.Size", "v": [int...]} | {"t": "torch.dtype", "v": name}
      | {"t": "array", "name": TENSOR, "kind": ..., "dtype": ..., "shape":
         [...], "store": CKPT DTYPE, ...}        (see _arrays.py)

Only exact types are accepted (a namedtuple or a defaultdict would come
back as something else): anything else is a TypeError naming its path.
"""

import collections
import json
import math
import re

from . import _arrays

TREE_NAME = "__ckpt_tree__"
VERSION = 1
MAX_NAME = 4096

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


_PLAIN_KEY = re.compile(r"[^%/\x00-\x1f\x7f]*\Z")


def _escape(key):
    s = key if isinstance(key, str) else repr(key)
    if _PLAIN_KEY.match(s) and s.isprintable():
        return s
    out = []
    for ch in s:
        if ch in "%/" or ord(ch) < 0x20 or ord(ch) == 0x7f:
            out.append("%%%02X" % ord(ch))
        else:
            out.append(ch)
    return "".join(out).encode("utf-8", "backslashreplace").decode("utf-8")


class _Flattener:
    def __init__(self, objs=None):
        self.objs = objs  # a list: also gets each leaf's object
        self.leaves = []
        self.used = {TREE_NAME}
        self.open = set()  # ids of the containers being walked

    def name(self, parts):
        base = "/".join(parts) if parts else "."
        name, n = base, 0
        while name in self.used or len(name.encode()) > MAX_NAME:
            n += 1
            suffix = "~%d" % n
            name = base.encode()[:MAX_NAME - len(suffix)].decode(
                "utf-8", "ignore") + suffix
        self.used.add(name)
        return name

    def node(self, x, parts):
        t = type(x)
        if x is None or t is bool or t is str or t is int:
            return x
        if t is float:
            if math.isfinite(x):
                return x
            return {"t": "float", "v": repr(x)}
        if t is dict or t is collections.OrderedDict or t is list or \
                t is tuple:
            if id(x) in self.open:
                raise TypeError("ckpt: %s: the state contains itself"
                                % _path(parts))
            self.open.add(id(x))
            n = self.container(x, t, parts)
            self.open.discard(id(x))
            return n
        if torch is not None:
            if t is torch.Size:
                return {"t": "torch.Size", "v": list(x)}
            if t is torch.dtype:
                return {"t": "torch.dtype", "v": str(x)[len("torch."):]}
        lf = _arrays.leaf(x, _path(parts))
        if lf is None:
            raise TypeError("ckpt: %s: cannot save a value of type %s"
                            % (_path(parts), t.__module__ + "." +
                               t.__qualname__))
        name = self.name(parts)
        self.leaves.append((name, lf))
        if self.objs is not None:
            self.objs.append(x)
        return dict({"t": "array", "name": name}, **lf.meta)

    def container(self, x, t, parts):
        if t is list or t is tuple:
            return {"t": t.__name__,
                    "v": [self.node(v, parts + [str(i)])
                          for i, v in enumerate(x)]}
        keys = list(x.keys())
        n = {"t": "dict" if t is dict else "odict",
             "k": [self.key(k, parts) for k in keys],
             "v": [self.node(x[k], parts + [_escape(k)]) for k in keys]}
        meta = getattr(x, "_metadata", None)
        if meta is not None:
            n["meta"] = self.node(meta, parts + ["_metadata"])
        return n

    def key(self, k, parts):
        if k is None or type(k) in (bool, int, str, float, tuple):
            return self.node(k, parts + ["<key>"])
        raise TypeError("ckpt: %s: dict key %r of type %s cannot be saved"
                        % (_path(parts), k, type(k).__name__))


def _path(parts):
    return "/" + "/".join(parts)


def flatten(state):
    """(tree JSON bytes, [(tensor name, _arrays.Leaf)])."""
    f = _Flattener()
    root = f.node(state, [])
    doc = json.dumps({"ckpt_tree": VERSION, "root": root},
                     separators=(",", ":"), allow_nan=False)
    return doc.encode("ascii"), f.leaves


def by_name(state):
    """{tensor name: array object} of a state, named as flatten() names
    them (the same structure gives the same names)."""
    objs = []
    f = _Flattener(objs)
    f.node(state, [])
    return {name: x for (name, _lf), x in zip(f.leaves, objs)}


def parse(doc):
    tree = json.loads(bytes(doc).decode("ascii"))
    if tree.get("ckpt_tree") != VERSION:
        raise ValueError("ckpt: unknown tree version %r"
                         % tree.get("ckpt_tree"))
    return tree["root"]


def arrays(root):
    """Every array node of the tree, in order."""
    out = []
    stack = [root]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            if n["t"] == "array":
                out.append(n)
            elif n["t"] in ("dict", "odict", "list", "tuple"):
                stack.extend(n.get("k", ()))
                stack.extend(n["v"])
                if "meta" in n:
                    stack.append(n["meta"])
    return out


def unflatten(node, values):
    """The state from the tree; values maps tensor names to restored
    leaves."""
    if not isinstance(node, dict):
        return node
    t = node["t"]
    if t == "array":
        return values[node["name"]]
    if t == "float":
        return float(node["v"])
    if t in ("list", "tuple"):
        items = [unflatten(v, values) for v in node["v"]]
        return items if t == "list" else tuple(items)
    if t in ("dict", "odict"):
        cls = dict if t == "dict" else collections.OrderedDict
        d = cls((unflatten(k, values), unflatten(v, values))
                for k, v in zip(node["k"], node["v"]))
        if "meta" in node:
            d._metadata = unflatten(node["meta"], values)
        return d
    if t == "torch.Size":
        return torch.Size(node["v"])
    if t == "torch.dtype":
        return getattr(torch, node["v"])
    raise ValueError("ckpt: unknown tree node %r" % t)
