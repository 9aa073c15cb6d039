/*
 * cmd_export.c - ckptctl export: write tensors of a step as a safetensors file.
 *
 * Design note: the header is built first (safetensors.c), then tensors
 * stream out in row-major order into FILE.tmp, which is fsynced and
 * renamed, so a reader never sees a partial file. Memory stays bounded:
 * a tensor larger than EXPORT_PIECE is read as boxes of whole inner rows.
 *
 *   ckpt_read_batch (runs of small tensors) / ckpt_read_slice (boxes)
 *       --> buf (<= piece) --> write(FILE.tmp)
 *                                                  --> rename(FILE)
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"

/* Largest piece of a tensor export reads at once; bigger tensors are read
 * in boxes along their outer dimensions so memory stays bounded. */
#define EXPORT_PIECE (64u << 20)

static const char help_export[] =
	"Usage: ckptctl export [OPTIONS] DIR[@STEP] -o FILE\n"
	"\n"
	"Write the tensors of a step (default: the latest) to a safetensors file,\n"
	"tensors in name order (or in --tensor order), metadata ckpt_step and\n"
	"ckpt_source. The file is written as FILE.tmp and renamed over FILE when\n"
	"complete; on failure or Ctrl-C FILE.tmp is removed and FILE untouched.\n"
	"\n"
	"Options:\n"
	"  -f, --format FMT    output format; only 'safetensors' (default)\n"
	"  -o, --output FILE   file to write (required)\n"
	"  -T, --tensor NAME   export only NAME (repeatable; each name once)\n"
	"  -j, --json          print a machine-readable summary\n"
	"  -h, --help          show this help\n"
	"\n"
	"Exit status: 0 written, 1 failure (e.g. a --tensor not in the step),\n"
	"2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl export /ckpt/run1@1000 --format safetensors -o model.safetensors\n"
	"  ckptctl export /ckpt/run1 -o emb.safetensors --tensor embed.weight\n";

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

typedef struct export_ctx {
	ckpt_reader *r;
	int fd;
	const char *tmp;
	uint8_t *buf;
	size_t cap;
	ckpt_read_req *reqs; /* export_group's batch */
	size_t nreqs;
	uint64_t done, total;
	uint64_t piece; /* largest read; EXPORT_PIECE unless testing */
	cli_progress *p;
} export_ctx;

static int ensure_cap(export_ctx *x, uint64_t n)
{
	void *nb;

	if (n <= x->cap)
		return 0;
	nb = realloc(x->buf, n);
	if (!nb) {
		cli_err("out of memory (%" PRIu64 " bytes)", n);
		return -1;
	}
	x->buf = nb;
	x->cap = n;
	return 0;
}

static int ensure_reqs(export_ctx *x, size_t n)
{
	void *nr;

	if (n <= x->nreqs)
		return 0;
	nr = realloc(x->reqs, n * sizeof(*x->reqs));
	if (!nr) {
		cli_err("out of memory");
		return -1;
	}
	x->reqs = nr;
	x->nreqs = n;
	return 0;
}

static int export_write(export_ctx *x, uint64_t n)
{
	int rc = write_all(x->fd, x->buf, n);

	if (rc) {
		cli_err("%s: %s", x->tmp, strerror(-rc));
		return -1;
	}
	x->done += n;
	if (cli_progress_fn(x->p, x->done, x->total)) {
		cli_err("interrupted");
		return -1;
	}
	return 0;
}

/*
 * Reads tensors [i, *next) (consecutive in the output, each at most a
 * piece, together at most a piece) with one ckpt_read_batch into x->buf at
 * their offsets in the output, then writes them with one write. One batch
 * reads each stored chunk once and keeps reads in file order and in
 * flight, where a ckpt_read per small tensor would reread (and decode) the
 * chunk the tensor shares with its neighbours, one round trip each.
 */
static int export_group(export_ctx *x, const ckpt_tensor_info *ti, size_t i,
			size_t count, size_t *next)
{
	uint64_t sum = 0;
	size_t n = 0;
	int rc;

	while (i + n < count && ti[i + n].nbytes > 0 &&
	       ti[i + n].nbytes <= x->piece - sum) {
		sum += ti[i + n].nbytes;
		n++;
	}
	*next = i + n;
	if (n == 0)
		return 0;
	if (ensure_cap(x, sum) || ensure_reqs(x, n))
		return -1;
	sum = 0;
	for (size_t k = 0; k < n; k++) {
		memset(&x->reqs[k], 0, sizeof(x->reqs[k]));
		x->reqs[k].name = ti[i + k].name;
		x->reqs[k].dst = x->buf + sum;
		x->reqs[k].dst_bytes = ti[i + k].nbytes;
		sum += ti[i + k].nbytes;
	}
	rc = ckpt_read_batch(x->r, x->reqs, n);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_reader_errmsg(x->r), rc));
		return -1;
	}
	return export_write(x, sum);
}

/*
 * Streams one tensor in row-major order. Tensors up to EXPORT_PIECE are
 * read whole; larger ones as boxes: the innermost dimensions that fit in a
 * piece are taken whole, the next one in blocks, the outer ones one index
 * at a time, so the concatenation of the boxes is the row-major array.
 */
static int export_tensor(export_ctx *x, const ckpt_tensor_info *ti)
{
	uint64_t off[CKPT_MAX_NDIM], ext[CKPT_MAX_NDIM], inner, k;
	uint32_t d;
	int rc;

	if (ti->nbytes == 0)
		return 0;
	if (ti->nbytes <= x->piece || ti->ndim == 0) {
		if (ensure_cap(x, ti->nbytes))
			return -1;
		rc = ckpt_read(x->r, ti->name, x->buf, ti->nbytes);
		if (rc)
			goto fail;
		return export_write(x, ti->nbytes);
	}
	inner = ckpt_dtype_size(ti->dtype);
	d = ti->ndim - 1;
	while (d > 0 && ti->shape[d] <= x->piece / inner) {
		inner *= ti->shape[d];
		d--;
	}
	k = x->piece / inner;
	if (k == 0)
		k = 1;
	for (uint32_t i = 0; i < ti->ndim; i++) {
		off[i] = 0;
		ext[i] = i < d ? 1 : ti->shape[i];
	}
	if (ensure_cap(x, (k < ti->shape[d] ? k : ti->shape[d]) * inner))
		return -1;
	for (;;) {
		int i;
		for (uint64_t j = 0; j < ti->shape[d]; j += k) {
			uint64_t n;
			off[d] = j;
			ext[d] = ti->shape[d] - j < k ? ti->shape[d] - j : k;
			n = ext[d] * inner;
			rc = ckpt_read_slice(x->r, ti->name, off, ext, x->buf,
					     n);
			if (rc)
				goto fail;
			if (export_write(x, n))
				return -1;
		}
		off[d] = 0;
		for (i = (int)d - 1; i >= 0; i--) {
			if (++off[i] < ti->shape[i])
				break;
			off[i] = 0;
		}
		if (i < 0)
			break;
	}
	return 0;
fail:
	cli_err("%s", cli_libmsg(ckpt_reader_errmsg(x->r), rc));
	return -1;
}

static int cmd_export(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "format", required_argument, NULL, 'f' },
		{ "output", required_argument, NULL, 'o' },
		{ "tensor", required_argument, NULL, 'T' },
		CLI_COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	static char esc[CLI_ESC_MAX];
	int c, st, json = 0, rc, ret = 1;
	const char *out_path = NULL;
	const char **names = NULL;
	size_t nnames = 0, count = 0;
	cli_location loc = { 0 };
	ckpt_reader *r = NULL;
	size_t *idx = NULL;
	st_entry *ent = NULL;
	ckpt_tensor_info *infos = NULL;
	char *hdr = NULL, *tmp = NULL, *src = NULL;
	size_t hdrlen = 0;
	char stepbuf[32], err[1024];
	export_ctx x = { 0 };
	cli_progress p;
	int have_progress = 0;
	const char *piece_env = getenv("CKPTCTL_EXPORT_PIECE");

	x.fd = -1;
	x.piece = EXPORT_PIECE;
	/* Test hook: tiny pieces exercise the huge-tensor path on small data. */
	if (piece_env &&
	    (cli_parse_u64(piece_env, &x.piece, 1) || x.piece == 0))
		x.piece = EXPORT_PIECE;
	names = calloc((size_t)argc, sizeof(*names));
	if (!names) {
		cli_err("out of memory");
		return 1;
	}
	while ((c = cli_getopt(argc, argv, ":f:o:T:jh", opts, help_export,
			       &json, &st)) != -1) {
		switch (c) {
		case 'f':
			if (strcmp(optarg, "safetensors") != 0) {
				free(names);
				return cli_usage(
					"unsupported format '%s' (only 'safetensors')",
					optarg);
			}
			break;
		case 'o':
			out_path = optarg;
			break;
		case 'T':
			names[nnames++] = optarg;
			break;
		case CLI_OPT_EXIT:
			free(names);
			return st;
		}
	}
	if ((rc = cli_operands(argc, 1, "missing DIR[@STEP]"))) {
		free(names);
		return rc;
	}
	if (!out_path || !*out_path) {
		free(names);
		return cli_usage("missing -o FILE");
	}
	if ((rc = cli_parse_location(argv[optind], 1, &loc))) {
		free(names);
		return rc;
	}
	cli_install_signals();
	if (cli_open_reader(&loc, cli_location_step(&loc), &r))
		goto out;

	/* Which tensors, in which order. */
	if (nnames) {
		count = nnames;
		idx = calloc(count, sizeof(*idx));
		if (!idx)
			goto oom;
		for (size_t i = 0; i < nnames; i++) {
			rc = ckpt_reader_find(r, names[i], &idx[i]);
			if (rc) {
				cli_err("tensor \"%s\" not found in step %" PRIu64,
					st_escape(names[i], esc, sizeof(esc)),
					ckpt_reader_step(r));
				goto out;
			}
			for (size_t j = 0; j < i; j++) {
				if (idx[j] == idx[i]) {
					cli_err("tensor \"%s\" named twice",
						st_escape(names[i], esc,
							  sizeof(esc)));
					goto out;
				}
			}
		}
	} else {
		count = ckpt_reader_tensor_count(r);
		idx = calloc(count ? count : 1, sizeof(*idx));
		if (!idx)
			goto oom;
		for (size_t i = 0; i < count; i++)
			idx[i] = i;
	}
	ent = calloc(count ? count : 1, sizeof(*ent));
	infos = calloc(count ? count : 1, sizeof(*infos));
	if (!ent || !infos)
		goto oom;
	for (size_t i = 0; i < count; i++) {
		rc = ckpt_reader_tensor(r, idx[i], &infos[i]);
		if (rc) {
			cli_err("%s", cli_libmsg(ckpt_reader_errmsg(r), rc));
			goto out;
		}
		ent[i].name = infos[i].name;
		ent[i].dtype = infos[i].dtype;
		ent[i].ndim = infos[i].ndim;
		ent[i].shape = infos[i].shape;
		ent[i].nbytes = infos[i].nbytes;
		x.total += infos[i].nbytes;
	}
	snprintf(stepbuf, sizeof(stepbuf), "%" PRIu64, ckpt_reader_step(r));
	src = realpath(loc.path, NULL);
	{
		const char *meta[] = { "ckpt_step", stepbuf, "ckpt_source",
				       src ? src : loc.path };
		if (st_header_build(ent, count, meta, 2, &hdr, &hdrlen, err,
				    sizeof(err))) {
			cli_err("%s", err);
			goto out;
		}
	}

	if (asprintf(&tmp, "%s.tmp", out_path) < 0) {
		tmp = NULL;
		goto oom;
	}
	x.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (x.fd < 0) {
		cli_err("%s: %s", tmp, strerror(errno));
		goto out;
	}
	x.r = r;
	x.tmp = tmp;
	rc = write_all(x.fd, hdr, hdrlen);
	if (rc) {
		cli_err("%s: %s", tmp, strerror(-rc));
		goto out;
	}
	cli_progress_init(&p, "export");
	have_progress = 1;
	x.p = &p;
	for (size_t i = 0, next; i < count; i = next) {
		if (export_group(&x, infos, i, count, &next))
			goto out;
		if (next == i && export_tensor(&x, &infos[next++]))
			goto out;
	}
	cli_progress_end(&p);
	have_progress = 0;
	if (fsync(x.fd) < 0 || close(x.fd) < 0) {
		x.fd = -1;
		cli_err("%s: %s", tmp, strerror(errno));
		goto out;
	}
	x.fd = -1;
	if (rename(tmp, out_path) < 0) {
		cli_err("rename %s -> %s: %s", tmp, out_path, strerror(errno));
		goto out;
	}
	if (json) {
		json_t *o = cli_jcheck(json_object());
		cli_jset(o, "step", cli_ju64(ckpt_reader_step(r)));
		cli_jset(o, "file", cli_jstr(out_path));
		cli_jset(o, "tensors", cli_ju64(count));
		cli_jset(o, "data_bytes", cli_ju64(x.total));
		cli_jset(o, "file_bytes", cli_ju64(hdrlen + x.total));
		cli_jprint(o);
	} else {
		printf("exported %zu tensor%s (%" PRIu64
		       " bytes) of step %" PRIu64 " to %s\n",
		       count, count == 1 ? "" : "s", x.total,
		       ckpt_reader_step(r),
		       st_escape(out_path, esc, sizeof(esc)));
	}
	ret = 0;
	goto out;
oom:
	cli_err("out of memory");
out:
	if (have_progress)
		cli_progress_end(&p);
	if (x.fd >= 0)
		close(x.fd);
	if (ret && tmp)
		unlink(tmp);
	free(x.buf);
	free(x.reqs);
	free(tmp);
	free(hdr);
	free(src);
	free(ent);
	free(infos);
	free(idx);
	free(names);
	ckpt_reader_close(r);
	cli_location_free(&loc);
	return ret;
}

CLI_DEFINE_COMMAND(export, "write tensors of a step as a safetensors file");
