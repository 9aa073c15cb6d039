"""smoke.py - bench/run.py --smoke's check of its own outputs.

Design note. CI cannot judge timings on a shared machine, so the smoke
run checks only that the harness produced what it promises, well formed:
table.txt with each section, results.json with its keys and, for every
size, samples of ours (C API per codec, Cloud Storage, Python), of each
limit and of each peer whose tool is installed (a missing tool must be
named in "skipped"), every sample a positive number; and non-empty PNG
files for each plot. check() returns the list of problems.
"""

import json
import os

import report

SECTIONS = ["Stall", "Save to durable", "Load everything",
            "Load into a model", "Partial loads", "Cloud Storage",
            "Peak RSS", "Limits"]


def check(out, a):
    bad = []
    try:
        with open(os.path.join(out, "table.txt")) as f:
            txt = f.read()
        bad += ["table.txt lacks " + s for s in SECTIONS if s not in txt]
    except OSError as e:
        bad.append("table.txt: %s" % e)
    try:
        with open(os.path.join(out, "results.json")) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return bad + ["results.json: %s" % e]
    for k in ("meta", "sizes", "skipped", "errors", "plots"):
        if k not in doc:
            bad.append("results.json lacks " + k)
    for k in ("date", "machine", "command", "reps", "load"):
        if k not in doc.get("meta", {}):
            bad.append("results.json meta lacks " + k)
    skipped = doc.get("skipped", {})
    bad += ["%s failed: %s" % (k, v[:300])
            for k, v in doc.get("errors", {}).items()]
    want = ["ours-c/%s|%s" % (c, m) for c in a.codecs
            for m in ("block_s", "save_s", "load_s", "load_one_s",
                      "load_slice_s", "rss_save", "rss_load")]
    want += ["ours-gcs/%s|%s" % (c, m) for c in a.gcs_codecs
             for m in ("save_s", "load_s", "durable_s")]
    want += ["ours-py/%s|%s" % (c, m) for c in a.py_codecs
             for m in ("block_s", "save_s", "load_s", "load_into_s",
                       "rss_into")]
    if "torch" in a.peers:
        want += ["torch|load_into_s", "torch|rss_into"]
    want += ["ours-c/%s-pool8|%s" % (a.codecs[-1], m)
             for m in ("block_s", "save_s", "rss_save")]
    want += ["limits|" + k for k in ("memcpy", "xxh3", "zstd1",
                                     "fio_write", "fio_read", "gcs_up")]
    want += ["%s|%s" % (p, m) for p in a.peers + ["ckptctl"]
             for m in ("save_s", "load_s", "rss_save")]
    if len(doc.get("sizes", [])) != len(a.sizes) * len(a.dtypes):
        bad.append("results.json: %d sizes, expected %d" %
                   (len(doc.get("sizes", [])), len(a.sizes) * len(a.dtypes)))
    for sz in doc.get("sizes", []):
        for k in ("label", "dtype", "bytes", "tensors", "samples",
                  "summary"):
            if k not in sz:
                bad.append("size lacks " + k)
        samples = sz.get("samples", {})
        for k in want:
            who = k.split("|")[0]
            if who.startswith("limits"):
                who = {"fio_write": "fio", "fio_read": "fio",
                       "gcs_up": "server ceiling"}.get(k.split("|")[1],
                                                       "cpu limits")
            if who in skipped:
                continue
            v = samples.get(k)
            if not v or any(not isinstance(x, (int, float)) or x <= 0
                            for x in v):
                bad.append("%s %s: %s = %r" % (sz.get("dtype"),
                                                sz.get("label"), k, v))
    for name, _y, _k, _s in report.PLOTS:
        p = os.path.join(out, name + ".png")
        try:
            with open(p, "rb") as f:
                head = f.read(8)
            if head != b"\x89PNG\r\n\x1a\n" or os.path.getsize(p) < 1000:
                bad.append(p + ": not a PNG")
        except OSError as e:
            bad.append("%s: %s" % (p, e))
    return bad
