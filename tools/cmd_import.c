/*
 * cmd_import.c - ckptctl import: save a safetensors file as a step.
 *
 * Design note: the file is mapped and fully validated (safetensors.c)
 * before anything is saved; its tensors then go to ckpt_save_ex() straight
 * from the mapping in borrow mode (CKPT_SAVE_BORROW: the workers encode
 * from the read-only mapping, nothing is copied into the staging pool
 * first), and ckpt_wait() commits. The pool then only holds encoded
 * output and raw chunks on their way to the disk, so it is kept small:
 * a one-shot process pays for faulting in its whole pool at open. On a terminal a thread polls
 * ckpt_poll() for the progress line; ckpt_poll only observes, so a failure
 * is reported by ckpt_wait() whether or not the poller saw it. A save
 * cannot be cancelled, so no signal handler: an interrupted import leaves
 * uncommitted debris for gc.
 *
 *   mmap(FILE) --> st_open (validate) --> ckpt_save_ex(BORROW) --> workers
 *       encode from the mapping --> pool buffers --> disk --> ckpt_wait
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"

/* Staging pool ceiling for import (borrow mode: output buffers and raw
 * chunks in flight only). */
#define IMPORT_POOL_MAX (128ull << 20)

static const char help_import[] =
	"Usage: ckptctl import [OPTIONS] FILE.safetensors DIR[@STEP]\n"
	"\n"
	"Save every tensor of a safetensors file as step STEP (default 0) of\n"
	"checkpoint root DIR (created if needed). The file is fully validated\n"
	"first (header, dtypes, shapes, offsets, overlaps). An import cannot be\n"
	"cancelled; if it is killed, the step is not committed and its files are\n"
	"debris for gc.\n"
	"\n"
	"Options:\n"
	"  -c, --codec none|zstd|float   chunk codec (default float)\n"
	"  -l, --level N                 zstd level of the zstd and float codecs\n"
	"                                (default 1)\n"
	"  -C, --chunk BYTES             chunk size, e.g. 4M (64K..64M, multiple\n"
	"                                of 4096; default 4M)\n"
	"  -r, --reason REASON           why the step is saved, kept in its commit\n"
	"                                record: periodic, maintenance, preempted,\n"
	"                                sigterm, manual, requested or upcoming\n"
	"  -j, --json                    print a machine-readable summary\n"
	"  -h, --help                    show this help\n"
	"\n"
	"Exit status: 0 imported and committed, 1 failure (e.g. invalid file,\n"
	"step already committed), 2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl import model.safetensors /ckpt/run1\n"
	"  ckptctl import --codec zstd --level 3 model.safetensors /ckpt/run1@500\n";

typedef struct poll_ctx {
	ckpt *h;
	cli_progress *p;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;
} poll_ctx;

static void *poll_thread(void *arg)
{
	poll_ctx *pc = arg;

	pthread_mutex_lock(&pc->mu);
	while (!pc->stop) {
		struct timespec ts;
		ckpt_progress pr;

		pthread_mutex_unlock(&pc->mu);
		memset(&pr, 0, sizeof(pr));
		(void)ckpt_poll(pc->h, &pr); /* a failure: ckpt_wait's */
		if (pr.bytes_total)
			cli_progress_fn(pc->p, pr.bytes_written,
					pr.bytes_total);
		pthread_mutex_lock(&pc->mu);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		if (!pc->stop)
			pthread_cond_timedwait(&pc->cv, &pc->mu, &ts);
	}
	pthread_mutex_unlock(&pc->mu);
	return NULL;
}

static void stop_poller(poll_ctx *pc, pthread_t th)
{
	pthread_mutex_lock(&pc->mu);
	pc->stop = 1;
	pthread_cond_signal(&pc->cv);
	pthread_mutex_unlock(&pc->mu);
	pthread_join(th, NULL);
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static int cmd_import(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "codec", required_argument, NULL, 'c' },
		{ "level", required_argument, NULL, 'l' },
		{ "chunk", required_argument, NULL, 'C' },
		{ "reason", required_argument, NULL, 'r' },
		CLI_COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	static char esc[CLI_ESC_MAX];
	int c, st, json = 0, rc, ret = 1, codec = -1, have_level = 0,
		   thread_started = 0;
	int64_t level = 0;
	int reason = CKPT_REASON_UNSPECIFIED;
	ckpt_save_opts so;
	uint64_t chunk = 0, stream = 0, total = 0, step;
	cli_location loc = { 0 };
	st_file f;
	int f_open = 0;
	ckpt_tensor *ts = NULL;
	ckpt_settings s;
	ckpt *h = NULL;
	char err[1024];
	cli_progress p;
	poll_ctx pc;
	pthread_t th;

	while ((c = cli_getopt(argc, argv, ":c:l:C:r:jh", opts, help_import,
			       &json, &st)) != -1) {
		switch (c) {
		case 'c':
			codec = ckpt_codec_from_name(optarg);
			if (codec < 0)
				return cli_usage(
					"unknown codec '%s' (none, zstd or float)",
					optarg);
			break;
		case 'l': {
			char *end;
			errno = 0;
			level = strtoll(optarg, &end, 10);
			if (errno || !*optarg || *end || level < INT32_MIN ||
			    level > INT32_MAX)
				return cli_usage("bad --level '%s'", optarg);
			have_level = 1;
			break;
		}
		case 'C':
			if (cli_parse_u64(optarg, &chunk, 1) || chunk == 0 ||
			    chunk > UINT32_MAX)
				return cli_usage("bad --chunk '%s'", optarg);
			break;
		case 'r':
			for (reason = CKPT_REASON_COUNT - 1; reason > 0;
			     reason--)
				if (!strcmp(optarg, ckpt_reason_name(reason)))
					break;
			if (reason == 0)
				return cli_usage("unknown reason '%s'", optarg);
			break;
		case CLI_OPT_EXIT:
			return st;
		}
	}
	if ((rc = cli_operands(argc, 2,
			       "expected FILE.safetensors DIR[@STEP]")))
		return rc;
	if ((rc = cli_parse_location(argv[optind + 1], 1, &loc)))
		return rc;
	if (cli_location_usable(&loc, 0))
		goto out;
	if (loc.kind == CLI_LOC_GCS) {
		cli_err("%s: import writes a directory; then 'ckptctl push'",
			loc.path);
		goto out;
	}
	step = loc.has_step ? loc.step : 0;

	if (st_open(&f, argv[optind], err, sizeof(err))) {
		cli_err("%s", err);
		goto out;
	}
	f_open = 1;
	ts = calloc(f.count ? f.count : 1, sizeof(*ts));
	if (!ts) {
		cli_err("out of memory");
		goto out;
	}
	for (size_t i = 0; i < f.count; i++) {
		const st_tensor *t = &f.tensors[i];
		ts[i].name = t->name;
		ts[i].dtype = t->dtype;
		ts[i].ndim = t->ndim;
		ts[i].shape = t->shape;
		ts[i].data = f.data + t->begin;
		ts[i].nbytes = t->end - t->begin;
		stream += round_up(ts[i].nbytes, 64);
		total += ts[i].nbytes;
	}

	ckpt_settings_default(&s);
	if (codec >= 0)
		s.codec = codec;
	if (have_level)
		s.level = (int32_t)level;
	if (chunk)
		s.chunk_bytes = (uint32_t)chunk;
	/* A pool as big as the data (up to IMPORT_POOL_MAX) keeps the disk
	 * busy; small files do not need the default 512 MiB. */
	{
		uint64_t cb = s.chunk_bytes ? s.chunk_bytes : (4u << 20);
		uint64_t pool = round_up(stream, cb) + cb;
		if (pool < 4 * cb)
			pool = 4 * cb;
		if (pool > IMPORT_POOL_MAX)
			pool = IMPORT_POOL_MAX > 4 * cb ? IMPORT_POOL_MAX :
							  4 * cb;
		s.staging_bytes = pool;
	}
	if ((rc = cli_mkdir_p(loc.path))) {
		cli_err("%s: %s", loc.path, strerror(-rc));
		goto out;
	}
	rc = ckpt_open(&h, loc.path, &s);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
		goto out;
	}

	/* No SIGINT handler here: a save cannot be cancelled, and an
	 * interrupted import leaves only uncommitted debris for gc. */
	cli_progress_init(&p, "import");
	memset(&pc, 0, sizeof(pc));
	memset(&th, 0, sizeof(th));
	pc.h = h;
	pc.p = &p;
	if (p.on) {
		pthread_mutex_init(&pc.mu, NULL);
		pthread_cond_init(&pc.cv, NULL);
		thread_started = pthread_create(&th, NULL, poll_thread, &pc) ==
				 0;
	}
	ckpt_save_opts_default(&so);
	so.reason = reason;
	so.flags = CKPT_SAVE_BORROW; /* the mapping is read-only anyway */
	rc = ckpt_save_ex(h, step, ts, f.count, &so);
	if (rc == 0)
		rc = ckpt_wait(h);
	if (thread_started)
		stop_poller(&pc, th);
	if (p.on) {
		pthread_mutex_destroy(&pc.mu);
		pthread_cond_destroy(&pc.cv);
	}
	cli_progress_end(&p);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(h), rc));
		goto out;
	}
	rc = ckpt_close(h);
	h = NULL;
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
		goto out;
	}
	if (json) {
		json_t *o = cli_jcheck(json_object());
		cli_jset(o, "file", cli_jstr(argv[optind]));
		cli_jset(o, "root", cli_jstr(loc.path));
		cli_jset(o, "step", cli_ju64(step));
		cli_jset(o, "tensors", cli_ju64(f.count));
		cli_jset(o, "bytes", cli_ju64(total));
		cli_jprint(o);
	} else {
		static char esc2[CLI_ESC_MAX];
		printf("imported %zu tensor%s (%" PRIu64
		       " bytes) from %s into %s as step %" PRIu64 "\n",
		       f.count, f.count == 1 ? "" : "s", total,
		       st_escape(argv[optind], esc, sizeof(esc)),
		       st_escape(loc.path, esc2, sizeof(esc2)), step);
	}
	ret = 0;
out:
	ckpt_close(h);
	free(ts);
	if (f_open)
		st_close(&f);
	cli_location_free(&loc);
	return ret;
}

CLI_DEFINE_COMMAND(import, "save a safetensors file as a step");
