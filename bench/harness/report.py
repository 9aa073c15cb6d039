"""report.py - what bench/run.py prints and writes from its samples.

Design note. The input is the run's document (run.py): per size, a dict
of samples, key "contender|metric" -> list of floats (one per
repetition; seconds, bytes or bytes per second). Everything shown is
derived here, the same way for the text table, the markdown section and
the plots:
  - each figure is the median of the repetitions with [min, max];
  - throughputs are logical bytes of state per second (MiB/s);
  - each of ours is divided by its limit (fio write for saves, fio read
    for loads, memcpy for the stall, the server's ceiling for Cloud
    Storage) and each peer's time is divided by ours (x faster).
summarize() adds "summary" to each size; tables() gives the sections as
(title, header, rows, note) used by both text() and markdown();
plots() writes gnuplot data and PNGs.
"""

import os
import statistics
import subprocess

MIB = float(1 << 20)

# (contender, label) in display order
OURS_SAVE = [("ours-c/none", "ckpt C API, codec none"),
             ("ours-c/zstd", "ckpt C API, codec zstd"),
             ("ours-c/float", "ckpt C API, codec float"),
             ("ours-py/none", "ckpt Python, codec none"),
             ("ours-py/float", "ckpt Python, codec float"),
             ("ckptctl", "ckptctl import/export (one-shot)")]
PEERS = [("torch", "torch.save / torch.load"),
         ("numpy", "np.save / np.load"),
         ("safetensors", "safetensors (own writer/reader)"),
         ("tar-zstd", "tar + zstd -T0 -1")]
POOL8 = [("ours-c/float-pool8", "ckpt C API, codec float, pool = state/8"),
         ("ours-c/none-pool8", "ckpt C API, codec none, pool = state/8")]
LIMITS = [("fio_write", "fio O_DIRECT write"),
          ("fio_read", "fio O_DIRECT read"),
          ("memcpy", "memcpy into warm memory (1 core)"),
          ("xxh3", "XXH3-64 (1 core)"),
          ("zstd1", "zstd -1 compress (1 core)"),
          ("unzstd1", "zstd -1 decompress (1 core)"),
          ("gcs_up", "loopback server upload ceiling (8 streams)"),
          ("gcs_down", "loopback server download ceiling (8 streams)")]


def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "n": len(xs)}


def summarize(doc):
    for sz in doc["sizes"]:
        sz["summary"] = {k: stats(v) for k, v in sz["samples"].items()}


def med(sz, key):
    s = sz["summary"].get(key)
    return s["median"] if s else None


def rate(sz, key):
    """Throughput of a time sample, {median, min, max} in B/s."""
    s = sz["summary"].get(key)
    if not s or s["median"] <= 0:
        return None
    b = sz["bytes"]
    return {"median": b / s["median"], "min": b / s["max"],
            "max": b / s["min"]}


def fmt_r(r):
    if not r:
        return "n/a"
    return "%.0f [%.0f-%.0f]" % (r["median"] / MIB, r["min"] / MIB,
                                 r["max"] / MIB)


def fmt_s(s, scale=1.0, digits=3):
    if not s:
        return "n/a"
    f = "%%.%df [%%.%df-%%.%df]" % (digits, digits, digits)
    return f % (s["median"] * scale, s["min"] * scale, s["max"] * scale)


def ratio(a, b):
    return "%.2fx" % (a / b) if a and b else "n/a"


def op_table(sz, op, limit_key, contenders):
    """Rows for op "save" or "load": throughput, x limit."""
    lim = med(sz, "limits|" + limit_key)
    rows = []
    for key, label in contenders:
        r = rate(sz, "%s|%s_s" % (key, op))
        if r:
            rows.append([label, fmt_r(r), ratio(r["median"], lim)])
    return rows


def vs_peers(sz, op):
    """x faster than each peer: peer median time / ours median time."""
    rows = []
    peers = [(k, lab) for k, lab in PEERS if med(sz, "%s|%s_s" % (k, op))]
    for key, label in OURS_SAVE:
        t = med(sz, "%s|%s_s" % (key, op))
        if t:
            rows.append([label] + [ratio(med(sz, "%s|%s_s" % (k, op)), t)
                                   for k, _l in peers])
    return [lab for _k, lab in peers], rows


def tables(sz):
    """[(title, header, rows, note)] for one size."""
    out = []
    mc = med(sz, "limits|memcpy")
    copy_s = sz["bytes"] / mc if mc else None
    rows = []
    for key, label in OURS_SAVE[:5]:
        for m, what in (("block_s", ""), ("first_block_s", ", first after open"),
                        ("borrow_block_s", ", borrow mode")):
            s = sz["summary"].get("%s|%s" % (key, m))
            if s:
                rows.append([label + what, fmt_s(s, 1e3, 1),
                             ratio(s["median"], copy_s)])
    out.append(("Stall: save() blocking time (ms)",
                ["", "median [min-max] ms", "x memcpy"], rows,
                "memcpy of the state into warm memory, one core: %s ms" %
                ("%.1f" % (copy_s * 1e3) if copy_s else "n/a")))
    out.append(("Save to durable (MiB/s of state)",
                ["", "median [min-max]", "x fio write"],
                op_table(sz, "save", "fio_write", OURS_SAVE + PEERS), None))
    out.append(("Load everything (MiB/s of state, page cache dropped)",
                ["", "median [min-max]", "x fio read"],
                op_table(sz, "load", "fio_read", OURS_SAVE + PEERS), None))
    for op in ("save", "load"):
        hdr, rows = vs_peers(sz, op)
        if hdr and rows:
            out.append(("%s: x faster than each peer (peer time / ours)"
                        % op.capitalize(), [""] + hdr, rows, None))
    rows = []
    t_peer = med(sz, "torch|load_into_s")
    for key, label in OURS_SAVE[3:5] + [
            ("torch", "torch.load + copy_ (as load_state_dict)")]:
        r = rate(sz, key + "|load_into_s")
        if r:
            t = med(sz, key + "|load_into_s")
            rows.append([label, fmt_r(r),
                         ratio(r["median"], med(sz, "limits|fio_read")),
                         ratio(t_peer, t) if key != "torch" else "",
                         fmt_s(sz["summary"].get(key + "|rss_into"),
                               1 / MIB, 0)])
    out.append(("Load into a model already built (MiB/s of state, page "
                "cache dropped; into memory touched before)",
                ["", "median [min-max]", "x fio read",
                 "x faster than torch.load + copy_", "peak RSS MiB"], rows,
                "ckpt reads in place (ckpt.load(into=...)); torch loads a "
                "second copy and copies it, as "
                "model.load_state_dict(torch.load(path)) does"))
    rows = []
    for key, label in OURS_SAVE[:3]:
        for m, what in (("load_one_s", "one tensor"), ("load_slice_s",
                                                     "one slice")):
            s = sz["summary"].get("%s|%s" % (key, m))
            if s:
                rows.append([label + ", " + what, fmt_s(s, 1e3, 1),
                             ratio(s["median"], med(sz, key + "|load_s"))])
    out.append(("Partial loads (ms, reader open included)",
                ["", "median [min-max] ms", "x load everything"], rows,
                "one tensor: %s; slice: the middle eighth of the rows of %s"
                % (sz.get("one", "?"), sz.get("slice", "?"))))
    rows = []
    for key, label, m, lim in (
            ("ours-gcs/none", "ckpt dir + gs://, codec none: committed in bucket", "save_s", "gcs_up"),
            ("ours-gcs/float", "ckpt dir + gs://, codec float: committed in bucket", "save_s", "gcs_up"),
            ("gcloud", "gcloud storage cp up", "save_s", "gcs_up"),
            ("ours-gcs/none", "ckpt load from gs://, codec none", "load_s", "gcs_down"),
            ("ours-gcs/float", "ckpt load from gs://, codec float", "load_s", "gcs_down"),
            ("gcloud", "gcloud storage cp down (+ fsync)", "load_s", "gcs_down")):
        r = rate(sz, "%s|%s" % (key, m))
        if r:
            g = med(sz, "gcloud|" + m)
            rows.append([label, fmt_r(r), ratio(r["median"],
                                                med(sz, "limits|" + lim)),
                         ratio(g, med(sz, "%s|%s" % (key, m)))
                         if key != "gcloud" else ""])
    out.append(("Cloud Storage, loopback fake_gcs.py (MiB/s of state)",
                ["", "median [min-max]", "x server ceiling",
                 "x faster than gcloud"], rows, None))
    rows = []
    small = [(k, lab) for k, lab in POOL8 if k in
             {x.split("|")[0] for x in sz["summary"]}]
    for key, label in small + OURS_SAVE + [
            ("ours-gcs/float", "ckpt dir + gs://, float")] + PEERS + [
            ("gcloud", "gcloud storage cp")]:
        a = sz["summary"].get(key + "|rss_save")
        b = sz["summary"].get(key + "|rss_load")
        budget = ""
        if key.endswith("-pool8") and a:
            budget = ratio(a["median"], sz["bytes"] * 1.125 + 64 * MIB)
        if a or b:
            rows.append([label, fmt_s(a, 1 / MIB, 0), fmt_s(b, 1 / MIB, 0),
                         budget])
    out.append(("Peak RSS (MiB; the process holds the %.0f MiB state "
                "throughout, tools' own for tar and gcloud)" %
                (sz["bytes"] / MIB),
                ["", "save", "load", "x (state + pool + 64 MiB)"], rows,
                "ckpt's pool is %.3g x the state but in the pool/8 row"
                % doc_pool_frac(sz)))
    rows = []
    for key, label in LIMITS:
        s = sz["summary"].get("limits|" + key)
        if s:
            rows.append([label, fmt_s(s, 1 / MIB, 0)])
    out.append(("Limits (MiB/s)", ["", "median [min-max]"], rows, None))
    return out


def doc_pool_frac(sz):
    return sz.get("pool_frac", 0)


def size_title(sz):
    return "%s state, %s: %.1f MiB in %d tensors" % (
        sz["label"], sz["dtype"], sz["bytes"] / MIB, sz["tensors"])


def text(doc):
    lines = []
    for sz in doc["sizes"]:
        lines.append("== " + size_title(sz))
        for title, hdr, rows, note in tables(sz):
            lines.append("-- " + title)
            w = [max(len(str(r[i])) for r in [hdr] + rows)
                 for i in range(len(hdr))]
            for r in [hdr] + rows:
                lines.append("  ".join(str(c).ljust(w[i]) if i == 0 else
                                       str(c).rjust(w[i])
                                       for i, c in enumerate(r)).rstrip())
            if note:
                lines.append("   (" + note + ")")
        lines.append("")
    return "\n".join(lines)


def markdown(doc):
    m = doc["meta"]
    cmd = m["command"]
    if m["note"]:  # said once, below, not in the command line
        cmd = cmd.replace(m["note"], "TEXT")
    note = m["note"].strip()
    if note and note[-1] not in ".!?":
        note += "."
    out = ["### Measured figures", "",
           "Generated by `%s` on %s, %s (%s). %s Medians of %d "
           "repetitions with [min-max]; ratios of medians." %
           (cmd, m["date"], m["machine"], m["load"], note,
            m["reps"]), ""]
    for sz in doc["sizes"]:
        out += ["#### " + size_title(sz), ""]
        for title, hdr, rows, note in tables(sz):
            if not rows:
                continue
            out += ["%s:" % title, "",
                    "| " + " | ".join(hdr) + " |",
                    "|" + "---|" * len(hdr)]
            out += ["| " + " | ".join(str(c) for c in r) + " |"
                    for r in rows]
            if note:
                out += ["", note + "."]
            out.append("")
    return "\n".join(out)


PLOTS = [
    ("save", "save to durable, MiB/s", "rate",
     [(k + "|save_s", lab) for k, lab in OURS_SAVE + PEERS] +
     [("limits|fio_write", "fio write (limit)")]),
    ("load", "load everything, MiB/s", "rate",
     [(k + "|load_s", lab) for k, lab in OURS_SAVE + PEERS] +
     [("limits|fio_read", "fio read (limit)")]),
    ("stall", "save() blocking time, s", "time",
     [(k + "|block_s", lab) for k, lab in OURS_SAVE[:5]]),
    ("memory", "peak RSS during save, MiB", "mib",
     [(k + "|rss_save", lab) for k, lab in POOL8 + OURS_SAVE + PEERS] +
     [("state", "the state itself")]),
]


def plot_value(sz, key, kind):
    if key == "state":
        return sz["bytes"] / MIB
    if key.startswith("limits|"):
        v = med(sz, key)
        return v / MIB if v else None
    if kind == "rate":
        r = rate(sz, key)
        return r["median"] / MIB if r else None
    v = med(sz, key)
    if v is None:
        return None
    return v / MIB if kind == "mib" else v


def plots(doc, outdir):
    """PNG per plot (x: state MiB, log scale), one line per dtype and
    contender; returns the PNG paths written (none without gnuplot)."""
    done = []
    for name, ylabel, kind, series in PLOTS:
        dat = os.path.join(outdir, name + ".dat")
        cols = []
        with open(dat, "w") as f:
            for dt in sorted({s["dtype"] for s in doc["sizes"]}):
                for key, lab in series:
                    pts = [(s["bytes"] / MIB, plot_value(s, key, kind))
                           for s in doc["sizes"] if s["dtype"] == dt]
                    pts = [p for p in pts if p[1] is not None]
                    if not pts:
                        continue
                    f.write("# %s %s\n" % (lab, dt))
                    for x, y in pts:
                        f.write("%g %g\n" % (x, y))
                    f.write("\n\n")
                    cols.append("%s (%s)" % (lab, dt))
        if not cols:
            continue
        png = os.path.join(outdir, name + ".png")
        script = ["set terminal png size 1000,800", "set output '%s'" % png,
                  "set logscale x 2", "set xlabel 'state size, MiB'",
                  "set ylabel '%s'" % ylabel, "set key below Left reverse",
                  "set yrange [0:*]", "set grid", "plot " + ", ".join(
                      "'%s' index %d with linespoints %s title '%s'" %
                      (dat, i, "dashtype 2 lw 2" if "limit" in c or
                       "state itself" in c else "lw 1.5",
                       c.replace("'", "")) for i, c in enumerate(cols))]
        try:
            subprocess.run(["gnuplot"], input="\n".join(script), text=True,
                           check=True, capture_output=True)
            done.append(png)
        except (OSError, subprocess.CalledProcessError) as e:
            print("report: gnuplot failed for %s: %s" % (name, e))
    return done
