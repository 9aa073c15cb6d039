/*
 * cmd_inspect.c - ckptctl inspect: show a step's tensors, codec totals and files.
 *
 * Design note: everything comes from one ckpt_reader (commit record and
 * indexes; no chunk is read), so inspect is cheap on any step size. Table
 * output escapes names for the terminal; JSON carries them exactly.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"

static const char help_inspect[] =
	"Usage: ckptctl inspect [OPTIONS] DIR[@STEP]\n"
	"\n"
	"Show a step (default: the latest): summary, tensors (name, dtype, shape,\n"
	"slices, raw and stored bytes, ratio), totals per codec and files.\n"
	"Control characters in names are escaped in table output; --json output\n"
	"carries names exactly.\n"
	"\n"
	"Options:\n"
	"  -j, --json    machine-readable output\n"
	"  -b, --bytes   print sizes in bytes\n"
	"  -h, --help    show this help\n"
	"\n"
	"Exit status: 0 shown, 1 failure (e.g. no such step, unreadable index),\n"
	"2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl inspect /ckpt/run1\n"
	"  ckptctl inspect --json /ckpt/run1@1000\n";

static int cmd_inspect(int argc, char **argv)
{
	int json = 0, rc, ret = 1;
	cli_location loc = { 0 };
	ckpt_reader *r = NULL;
	ckpt_stats stats;
	size_t nt, nf, shape_w = 5;
	uint64_t file_bytes;
	static char esc[CLI_ESC_MAX];

	rc = cli_display_args(argc, argv, help_inspect, 1, &json, &loc);
	if (rc >= 0)
		return rc;
	if (cli_open_reader(&loc, cli_location_step(&loc), &r))
		goto out;
	rc = ckpt_reader_stats(r, &stats);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_reader_errmsg(r), rc));
		goto out;
	}
	nt = ckpt_reader_tensor_count(r);
	cli_files_total(r, &nf, &file_bytes);

	if (json) {
		json_t *root = cli_jcheck(json_object()),
		       *ta = cli_jcheck(json_array());
		json_t *codecs = cli_jcheck(json_object()),
		       *fa = cli_jcheck(json_array());
		char t[64];

		cli_jset(root, "root", cli_jstr(loc.path));
		cli_jset(root, "step", cli_ju64(ckpt_reader_step(r)));
		cli_jset(root, "hosts", cli_ju64(ckpt_reader_host_count(r)));
		cli_jset(root, "commit_unix_ns",
			 cli_jcheck(json_integer(ckpt_reader_commit_time(r))));
		cli_jset(root, "time",
			 cli_jstr(cli_fmt_time(ckpt_reader_commit_time(r), t,
					       sizeof(t))));
		cli_jset(root, "reason",
			 cli_jstr(cli_reason_name(stats.reason)));
		cli_jset(root, "tensor_count", cli_ju64(nt));
		cli_jset(root, "raw_bytes", cli_ju64(stats.raw_bytes));
		cli_jset(root, "stored_bytes", cli_ju64(stats.stored_bytes));
		cli_jset(root, "file_bytes", cli_ju64(stats.file_bytes));
		cli_jset(root, "ratio",
			 cli_jratio(stats.raw_bytes, stats.stored_bytes));
		cli_jset(root, "chunks", cli_ju64(stats.chunks));
		for (size_t i = 0; i < nt; i++) {
			ckpt_tensor_info ti;
			json_t *o, *sl;
			if ((rc = ckpt_reader_tensor(r, i, &ti))) {
				cli_err("%s",
					cli_libmsg(ckpt_reader_errmsg(r), rc));
				json_decref(root);
				json_decref(ta);
				json_decref(codecs);
				json_decref(fa);
				goto out;
			}
			o = cli_jcheck(json_object());
			sl = cli_jcheck(json_array());
			cli_jset(o, "name", cli_jstr(ti.name));
			cli_jset(o, "dtype",
				 cli_jstr(ckpt_dtype_name(ti.dtype) ?
						  ckpt_dtype_name(ti.dtype) :
						  "?"));
			cli_jset(o, "safetensors_dtype",
				 st_dtype_name(ti.dtype) ?
					 cli_jstr(st_dtype_name(ti.dtype)) :
					 json_null());
			cli_jset(o, "shape", cli_jshape(ti.shape, ti.ndim));
			cli_jset(o, "nbytes", cli_ju64(ti.nbytes));
			cli_jset(o, "stored_bytes", cli_ju64(ti.stored_bytes));
			cli_jset(o, "ratio",
				 cli_jratio(ti.nbytes, ti.stored_bytes));
			cli_jset(o, "slice_count", cli_ju64(ti.slice_count));
			for (uint32_t j = 0; j < ti.slice_count; j++) {
				ckpt_slice_info si;
				json_t *so;
				if (ckpt_reader_slice(r, i, j, &si))
					continue;
				so = cli_jcheck(json_object());
				cli_jset(so, "host", cli_ju64(si.host));
				cli_jset(so, "offset",
					 cli_jshape(si.offset, ti.ndim));
				cli_jset(so, "extent",
					 cli_jshape(si.extent, ti.ndim));
				cli_jset(so, "nbytes", cli_ju64(si.nbytes));
				cli_jappend(sl, so);
			}
			cli_jset(o, "slices", sl);
			cli_jappend(ta, o);
		}
		cli_jset(root, "tensors", ta);
		for (int k = 0; k < CKPT_CODEC_COUNT; k++) {
			json_t *o = cli_jcheck(json_object());
			cli_jset(o, "chunks",
				 cli_ju64(stats.chunks_by_codec[k]));
			cli_jset(o, "raw_bytes",
				 cli_ju64(stats.raw_by_codec[k]));
			cli_jset(o, "stored_bytes",
				 cli_ju64(stats.stored_by_codec[k]));
			cli_jset(o, "ratio",
				 cli_jratio(stats.raw_by_codec[k],
					    stats.stored_by_codec[k]));
			cli_jset(codecs,
				 ckpt_codec_name(k) ? ckpt_codec_name(k) : "?",
				 o);
		}
		cli_jset(root, "codecs", codecs);
		for (size_t i = 0; i < nf; i++) {
			ckpt_file_info fi;
			json_t *o;
			char x[24];
			if (ckpt_reader_file(r, i, &fi))
				continue;
			o = cli_jcheck(json_object());
			snprintf(x, sizeof(x), "%016" PRIx64, fi.xxh3);
			cli_jset(o, "name", cli_jstr(fi.name));
			cli_jset(o, "host", cli_ju64(fi.host));
			cli_jset(o, "kind", cli_jstr(cli_kind_name(fi.kind)));
			cli_jset(o, "size", cli_ju64(fi.size));
			cli_jset(o, "xxh3", cli_jstr(x));
			cli_jappend(fa, o);
		}
		cli_jset(root, "files", fa);
		cli_jprint(root);
		ret = 0;
		goto out;
	}

	{
		char a[32], b[32], q[32], t[64];
		printf("step %" PRIu64 " of %s\n", ckpt_reader_step(r),
		       st_escape(loc.path, esc, sizeof(esc)));
		printf("  committed  %s\n",
		       cli_fmt_time(ckpt_reader_commit_time(r), t, sizeof(t)));
		printf("  reason     %s\n", cli_reason_name(stats.reason));
		printf("  hosts      %u\n", ckpt_reader_host_count(r));
		printf("  tensors    %zu\n", nt);
		printf("  raw        %s\n",
		       cli_fmt_size(stats.raw_bytes, a, sizeof(a)));
		printf("  stored     %s in %" PRIu64 " chunks (ratio %s)\n",
		       cli_fmt_size(stats.stored_bytes, b, sizeof(b)),
		       stats.chunks,
		       cli_fmt_ratio(stats.raw_bytes, stats.stored_bytes, q,
				     sizeof(q)));
		printf("  files      %zu, %s\n", nf,
		       cli_fmt_size(file_bytes, a, sizeof(a)));
	}

	/* Shapes vary in width; size that column, keep the name last. */
	for (size_t i = 0; i < nt; i++) {
		ckpt_tensor_info ti;
		char sh[512];
		if (ckpt_reader_tensor(r, i, &ti) == 0) {
			size_t w = strlen(cli_fmt_shape(ti.shape, ti.ndim, sh,
							sizeof(sh)));
			if (w > shape_w)
				shape_w = w;
		}
	}
	printf("\nTENSORS\n%-7s %-*s %6s %11s %11s %8s  %s\n", "DTYPE",
	       (int)shape_w, "SHAPE", "SLICES", "RAW", "STORED", "RATIO",
	       "NAME");
	for (size_t i = 0; i < nt; i++) {
		ckpt_tensor_info ti;
		char sh[512], a[32], b[32], q[32];
		const char *dn;
		if ((rc = ckpt_reader_tensor(r, i, &ti))) {
			cli_err("%s", cli_libmsg(ckpt_reader_errmsg(r), rc));
			goto out;
		}
		dn = ckpt_dtype_name(ti.dtype);
		printf("%-7s %-*s %6u %11s %11s %8s  %s\n", dn ? dn : "?",
		       (int)shape_w,
		       cli_fmt_shape(ti.shape, ti.ndim, sh, sizeof(sh)),
		       ti.slice_count, cli_fmt_size(ti.nbytes, a, sizeof(a)),
		       cli_fmt_size(ti.stored_bytes, b, sizeof(b)),
		       cli_fmt_ratio(ti.nbytes, ti.stored_bytes, q, sizeof(q)),
		       st_escape(ti.name, esc, sizeof(esc)));
	}
	printf("\nCODECS\n%-7s %8s %11s %11s %8s\n", "CODEC", "CHUNKS", "RAW",
	       "STORED", "RATIO");
	for (int k = 0; k < CKPT_CODEC_COUNT; k++) {
		char a[32], b[32], q[32];
		const char *cn = ckpt_codec_name(k);
		if (stats.chunks_by_codec[k] == 0)
			continue;
		printf("%-7s %8" PRIu64 " %11s %11s %8s\n", cn ? cn : "?",
		       stats.chunks_by_codec[k],
		       cli_fmt_size(stats.raw_by_codec[k], a, sizeof(a)),
		       cli_fmt_size(stats.stored_by_codec[k], b, sizeof(b)),
		       cli_fmt_ratio(stats.raw_by_codec[k],
				     stats.stored_by_codec[k], q, sizeof(q)));
	}
	printf("\nFILES\n%-6s %5s %11s %-16s  %s\n", "KIND", "HOST", "SIZE",
	       "XXH3", "NAME");
	for (size_t i = 0; i < nf; i++) {
		ckpt_file_info fi;
		char a[32];
		if (ckpt_reader_file(r, i, &fi))
			continue;
		printf("%-6s %5u %11s %016" PRIx64 "  %s\n",
		       cli_kind_name(fi.kind), fi.host,
		       cli_fmt_size(fi.size, a, sizeof(a)), fi.xxh3,
		       st_escape(fi.name, esc, sizeof(esc)));
	}
	ret = 0;
out:
	ckpt_reader_close(r);
	cli_location_free(&loc);
	return ret;
}

CLI_DEFINE_COMMAND(inspect, "show a step's tensors, codec totals and files");
