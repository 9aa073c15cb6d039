/*
 * cmd_export.c - ckptctl export: write tensors of a step as a safetensors file.
 *
 * Design note: the header is built first (safetensors.c), then tensors
 * stream out in row-major order into FILE.tmp, which is fsynced and
 * renamed, so a reader never sees a partial file. Memory stays bounded:
 * a tensor larger than EXPORT_PIECE is read as boxes of whole inner rows.
 * Reading and writing overlap: pieces are read into one of two buffers
 * while a writer thread writes the other. FILE.tmp is written with
 * O_DIRECT where the file system takes it (the page cache would only add
 * a copy and a writeback at fsync: on a 2-core VM buffered writes + fsync
 * ran at half fio's O_DIRECT speed), in whole 4 KiB blocks: the bytes of
 * a piece past its last whole block are carried to the front of the next
 * buffer, and the last partial block is written without O_DIRECT at the
 * end. A file system that refuses O_DIRECT (open or write: EINVAL) gets
 * buffered writes.
 *
 *   ckpt_read_batch (runs of small tensors) / ckpt_read_slice (boxes)
 *       --> b[cur] (carry + piece) --hand off--> writer thread
 *                                   --pwrite(O_DIRECT)--> FILE.tmp
 *                                                  --> rename(FILE)
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
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

/* O_DIRECT's unit: offsets, lengths and memory of direct writes. */
#define EXPORT_ALIGN 4096u

typedef struct export_buf {
	uint8_t *p; /* EXPORT_ALIGN-aligned */
	size_t cap;
} export_buf;

typedef struct export_ctx {
	ckpt_reader *r;
	int fd;
	const char *tmp;
	export_buf b[2];
	unsigned cur;  /* the buffer being filled */
	size_t carry;  /* bytes at the front of b[cur] not yet written */
	uint8_t *buf;  /* b[cur].p + carry: where the next read goes */
	uint64_t woff; /* file offset of b[cur].p[0] */
	ckpt_read_req *reqs; /* export_group's batch */
	size_t nreqs;
	uint64_t done, total;
	uint64_t piece; /* largest read; EXPORT_PIECE unless testing */
	cli_progress *p;
	/* the writer thread; direct, wp..werr under mu */
	pthread_t th;
	int th_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int direct; /* fd has O_DIRECT */
	int busy, stop;
	const uint8_t *wp;
	size_t wlen;
	uint64_t wat;
	int werr; /* -errno of the first failed write */
} export_ctx;

/* Turns O_DIRECT off on fd: 0 or -errno. */
static int drop_direct(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) < 0)
		return -errno;
	return 0;
}

/* Writes p[0..len) at `at`, whole; drops O_DIRECT where it is refused. */
static int pwrite_all(export_ctx *x, const uint8_t *p, size_t len,
		      uint64_t at, int *direct)
{
	while (len) {
		ssize_t w = pwrite(x->fd, p, len, (off_t)at);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EINVAL && *direct) {
			int rc = drop_direct(x->fd);

			if (rc)
				return rc;
			*direct = 0;
			continue;
		}
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		p += w;
		at += (uint64_t)w;
		len -= (size_t)w;
	}
	return 0;
}

static void *export_writer(void *arg)
{
	export_ctx *x = arg;

	pthread_mutex_lock(&x->mu);
	for (;;) {
		const uint8_t *p;
		size_t len;
		uint64_t at;
		int direct, rc;

		while (!x->busy && !x->stop)
			pthread_cond_wait(&x->cv, &x->mu);
		if (!x->busy)
			break;
		p = x->wp;
		len = x->wlen;
		at = x->wat;
		direct = x->direct;
		pthread_mutex_unlock(&x->mu);
		rc = x->werr ? 0 : pwrite_all(x, p, len, at, &direct);
		pthread_mutex_lock(&x->mu);
		x->direct = direct;
		if (rc && !x->werr)
			x->werr = rc;
		x->busy = 0;
		pthread_cond_broadcast(&x->cv);
	}
	pthread_mutex_unlock(&x->mu);
	return NULL;
}

/* Waits until the writer is idle; its error, if any (named). */
static int export_idle(export_ctx *x)
{
	int rc;

	pthread_mutex_lock(&x->mu);
	while (x->busy)
		pthread_cond_wait(&x->cv, &x->mu);
	rc = x->werr;
	pthread_mutex_unlock(&x->mu);
	if (rc)
		cli_err("%s: %s", x->tmp, strerror(-rc));
	return rc ? -1 : 0;
}

static void export_stop(export_ctx *x)
{
	if (!x->th_started)
		return;
	pthread_mutex_lock(&x->mu);
	x->stop = 1;
	pthread_cond_broadcast(&x->cv);
	pthread_mutex_unlock(&x->mu);
	pthread_join(x->th, NULL);
	x->th_started = 0;
}

/* b (idle) holds at least n bytes; its first `keep` bytes are kept. */
static int buf_grow(export_buf *b, size_t n, size_t keep)
{
	void *nb;

	if (n <= b->cap)
		return 0;
	n = (n + EXPORT_ALIGN - 1) / EXPORT_ALIGN * EXPORT_ALIGN;
	if (posix_memalign(&nb, EXPORT_ALIGN, n)) {
		cli_err("out of memory (%zu bytes)", n);
		return -1;
	}
	if (keep)
		memcpy(nb, b->p, keep);
	free(b->p);
	b->p = nb;
	b->cap = n;
	return 0;
}

/* x->buf has room for n bytes. */
static int ensure_cap(export_ctx *x, uint64_t n)
{
	if (n > SIZE_MAX - x->carry - EXPORT_ALIGN) {
		cli_err("out of memory (%" PRIu64 " bytes)", n);
		return -1;
	}
	if (buf_grow(&x->b[x->cur], x->carry + n, x->carry))
		return -1;
	x->buf = x->b[x->cur].p + x->carry;
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

/*
 * n bytes were put at x->buf: hands the whole blocks of b[cur] to the
 * writer (all of it without O_DIRECT) once it is done with the other
 * buffer, whose front takes the rest. `data`: tensor bytes (progress).
 */
static int export_write(export_ctx *x, uint64_t n, int data)
{
	size_t total = x->carry + (size_t)n, keep;

	if (export_idle(x))
		return -1;
	keep = x->direct ? total % EXPORT_ALIGN : 0;
	if (total > keep) {
		export_buf *o = &x->b[x->cur ^ 1];

		if (buf_grow(o, keep, 0))
			return -1;
		if (keep)
			memcpy(o->p, x->b[x->cur].p + total - keep, keep);
		pthread_mutex_lock(&x->mu);
		x->wp = x->b[x->cur].p;
		x->wlen = total - keep;
		x->wat = x->woff;
		x->busy = 1;
		pthread_cond_broadcast(&x->cv);
		pthread_mutex_unlock(&x->mu);
		x->woff += total - keep;
		x->cur ^= 1;
	}
	x->carry = keep; /* all of it when no whole block was filled */
	x->buf = NULL;   /* ensure_cap before the next read */
	if (data)
		x->done += n;
	if (data && cli_progress_fn(x->p, x->done, x->total)) {
		cli_err("interrupted");
		return -1;
	}
	return 0;
}

/* The writer's last buffer and the tail; then the caller fsyncs. */
static int export_finish(export_ctx *x)
{
	int direct = 0, rc;

	if (export_idle(x))
		return -1;
	if (!x->carry)
		return 0;
	/* a partial block: through the page cache */
	rc = x->direct ? drop_direct(x->fd) : 0;
	if (!rc)
		rc = pwrite_all(x, x->b[x->cur].p, x->carry, x->woff,
				&direct);
	if (rc) {
		cli_err("%s: %s", x->tmp, strerror(-rc));
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
	return export_write(x, sum, 1);
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
		return export_write(x, ti->nbytes, 1);
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
	for (;;) {
		int i;
		for (uint64_t j = 0; j < ti->shape[d]; j += k) {
			uint64_t n;
			off[d] = j;
			ext[d] = ti->shape[d] - j < k ? ti->shape[d] - j : k;
			n = ext[d] * inner;
			if (ensure_cap(x, n))
				return -1;
			rc = ckpt_read_slice(x->r, ti->name, off, ext, x->buf,
					     n);
			if (rc)
				goto fail;
			if (export_write(x, n, 1))
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
	pthread_mutex_init(&x.mu, NULL);
	pthread_cond_init(&x.cv, NULL);
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
	/* Test hook: the buffered path of file systems without O_DIRECT
	 * (tmpfs before Linux 6.6, some FUSE and network file systems). */
	x.direct = !getenv("CKPTCTL_EXPORT_BUFFERED");
	x.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC |
			    (x.direct ? O_DIRECT : 0), 0644);
	if (x.fd < 0 && errno == EINVAL && x.direct) {
		x.direct = 0;
		x.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			    0644);
	}
	if (x.fd < 0) {
		cli_err("%s: %s", tmp, strerror(errno));
		goto out;
	}
	x.r = r;
	x.tmp = tmp;
	rc = pthread_create(&x.th, NULL, export_writer, &x);
	if (rc) {
		cli_err("cannot start a thread: %s", strerror(rc));
		goto out;
	}
	x.th_started = 1;
	if (ensure_cap(&x, hdrlen))
		goto out;
	memcpy(x.buf, hdr, hdrlen);
	if (export_write(&x, hdrlen, 0))
		goto out;
	cli_progress_init(&p, "export");
	have_progress = 1;
	x.p = &p;
	for (size_t i = 0, next; i < count; i = next) {
		if (export_group(&x, infos, i, count, &next))
			goto out;
		if (next == i && export_tensor(&x, &infos[next++]))
			goto out;
	}
	if (export_finish(&x))
		goto out;
	export_stop(&x);
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
	export_stop(&x);
	if (have_progress)
		cli_progress_end(&p);
	if (x.fd >= 0)
		close(x.fd);
	if (ret && tmp)
		unlink(tmp);
	pthread_cond_destroy(&x.cv);
	pthread_mutex_destroy(&x.mu);
	free(x.b[0].p);
	free(x.b[1].p);
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
