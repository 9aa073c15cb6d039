/*
 * cmd_restore.c - ckptctl restore and push: copy a step, verified, to
 * another location (a directory or gs://BUCKET/PREFIX, either way).
 *
 * Design note: ckpt_reader_copy() copies and checks every file's size and
 * XXH3 and commits at the destination only when all matched (to gs://:
 * resumable uploads with crc32c, COMMIT created last, only if absent);
 * this file refuses a copy onto the source itself (realpath, or the same
 * gs:// string) because that would truncate what it reads, and copies the
 * older steps a deduplicated step refers to first where the destination
 * lacks them (ckpt_reader_ref_steps; those refer only to steps older
 * still, so the recursion ends). push is restore with a local source and
 * a gs:// destination.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"

static const char help_restore[] =
	"Usage: ckptctl restore [OPTIONS] LOCATION[@STEP] --to DEST\n"
	"\n"
	"Copy a step (default: the latest) into checkpoint root DEST, checking\n"
	"every file's size and XXH3 while copying. LOCATION and DEST are each a\n"
	"directory or gs://BUCKET/PREFIX (Cloud Storage: ranged reads in\n"
	"parallel down, resumable uploads with crc32c up). The step is committed\n"
	"at the destination only if everything matched, its commit record\n"
	"written last. DEST must not be LOCATION itself. Ctrl-C cancels;\n"
	"nothing is committed then. A deduplicated step (one that refers to\n"
	"older steps' bytes) goes after those steps: the ones DEST lacks are\n"
	"copied first, oldest first, each committed on its own.\n"
	"\n"
	"Options:\n"
	"  -t, --to DEST     destination root (required; a directory is created\n"
	"                    if needed)\n"
	"  -j, --json        machine-readable output\n"
	"  -h, --help        show this help\n"
	"\n"
	"Progress is shown on a terminal. Exit status: 0 copied and committed,\n"
	"1 failure (nothing committed), 2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl restore /mnt/backup/run1@1000 --to /ckpt/run1\n"
	"  ckptctl restore gs://my-bucket/run1 --to /ckpt/run1\n"
	"  ckptctl restore /ckpt/run1@1000 --to gs://my-bucket/run1\n";

static const char help_push[] =
	"Usage: ckptctl push [OPTIONS] DIR[@STEP] gs://BUCKET/PREFIX\n"
	"\n"
	"Upload a committed local step (default: the latest) to Cloud Storage:\n"
	"every file is read once, its XXH3 checked against the commit record,\n"
	"and sent in a resumable upload carrying its crc32c (the server rejects\n"
	"bytes that do not match), all files at once up to CKPT_GCS_STREAMS\n"
	"(default 8) parallel uploads; the commit record is created last, only if\n"
	"absent, so readers never see a partial step. A push interrupted\n"
	"before its commit, run again, keeps the objects already sent (same\n"
	"size and crc32c) and sends the rest. A deduplicated step goes after\n"
	"the older steps it refers to: those the bucket lacks are pushed\n"
	"first. The same as\n"
	"'ckptctl restore DIR[@STEP] --to gs://BUCKET/PREFIX'.\n"
	"\n"
	"Options:\n"
	"  -j, --json        machine-readable output\n"
	"  -h, --help        show this help\n"
	"\n"
	"The endpoint and credentials come from STORAGE_EMULATOR_HOST,\n"
	"CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE, CLOUDSDK_AUTH_ACCESS_TOKEN_FILE\n"
	"or the metadata server; CKPT_GCS_STREAMS sets the parallel transfers.\n"
	"Exit status: 0 uploaded and committed, 1 failure (nothing committed),\n"
	"2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl push /ckpt/run1@1000 gs://my-bucket/run1\n";

/* 1 if src and dst name the same root (a copy onto itself would read
 * what it truncates). */
static int same_root(const cli_location *a, const cli_location *b)
{
	char *x, *y;
	int same;

	if (a->kind != b->kind)
		return 0;
	if (a->kind == CLI_LOC_GCS)
		return strcmp(a->path, b->path) == 0;
	x = realpath(a->path, NULL);
	y = realpath(b->path, NULL);
	same = x && y && strcmp(x, y) == 0;
	free(x);
	free(y);
	return same;
}

/* 1 if dst has step committed (readable). */
static int dst_holds(const cli_location *dst, uint64_t step)
{
	ckpt_reader *d = NULL;

	if (ckpt_reader_open(&d, dst->path, step, NULL) < 0)
		return 0;
	ckpt_reader_close(d);
	return 1;
}

static int copy_step(const cli_location *loc, const cli_location *dst, int json,
		     const char *verb, json_t *also);

/* The older steps r's step refers to that dst lacks, copied first; their
 * numbers go into `also` (JSON output) or a line each. */
static int copy_refs(ckpt_reader *r, const cli_location *loc,
		     const cli_location *dst, const char *verb, json_t *also)
{
	size_t n = ckpt_reader_ref_steps(r, NULL, 0), i;
	uint64_t *steps = n ? calloc(n, sizeof(*steps)) : NULL;
	int ret = 0;

	if (n && !steps) {
		cli_err("out of memory");
		return 1;
	}
	n = ckpt_reader_ref_steps(r, steps, n);
	for (i = 0; i < n && ret == 0; i++) {
		cli_location sub = *loc;

		if (dst_holds(dst, steps[i]))
			continue;
		sub.has_step = 1;
		sub.step = steps[i];
		ret = copy_step(&sub, dst, also != NULL, verb, also);
	}
	free(steps);
	return ret;
}

/* Copies loc's step to dst (both parsed), after the steps it refers to;
 * the exit status. Nested copies (also != NULL when json) add their step
 * to `also` rather than print an object of their own. */
static int copy_step(const cli_location *loc, const cli_location *dst, int json,
		     const char *verb, json_t *also)
{
	ckpt_reader *r = NULL;
	cli_progress p;
	size_t nf;
	uint64_t bytes, step;
	char label[64];
	int rc, ret = 1, top = !also;

	if (cli_location_usable(dst, 0))
		return 1;
	if (same_root(loc, dst)) {
		cli_err("source and destination are the same location");
		return 1;
	}
	cli_install_signals();
	if (cli_open_reader(loc, cli_location_step(loc), &r))
		return 1;
	if (dst->kind == CLI_LOC_LOCAL && (rc = cli_mkdir_p(dst->path))) {
		cli_err("%s: %s", dst->path, strerror(-rc));
		goto out;
	}
	if (top && json)
		also = cli_jcheck(json_array());
	if (copy_refs(r, loc, dst, verb, also))
		goto out;
	step = ckpt_reader_step(r);
	cli_files_total(r, &nf, &bytes);
	snprintf(label, sizeof(label), "%s step %" PRIu64, verb, step);
	cli_progress_init(&p, label);
	rc = ckpt_reader_copy(r, dst->path, cli_progress_fn, &p);
	cli_progress_end(&p);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_reader_errmsg(r), rc));
		goto out;
	}
	if (json && !top) {
		cli_jappend(also, cli_ju64(step));
	} else if (json) {
		json_t *o = cli_jcheck(json_object());
		cli_jset(o, "step", cli_ju64(step));
		/* the older steps copied first, for this one refers to them */
		cli_jset(o, "copied_first", also);
		also = NULL;
		cli_jset(o, "source", cli_jstr(loc->path));
		cli_jset(o, "destination", cli_jstr(dst->path));
		cli_jset(o, "files", cli_ju64(nf));
		cli_jset(o, "bytes", cli_ju64(bytes));
		cli_jprint(o);
	} else {
		static char esc[CLI_ESC_MAX];
		printf("%s step %" PRIu64 " to %s: %zu files, %" PRIu64
		       " bytes verified\n",
		       strcmp(verb, "push") ? "restored" : "pushed", step,
		       st_escape(dst->path, esc, sizeof(esc)), nf, bytes);
	}
	ret = 0;
out:
	if (top)
		json_decref(also);
	ckpt_reader_close(r);
	return ret;
}

static int cmd_restore(int argc, char **argv)
{
	static const struct option opts[] = { { "to", required_argument, NULL,
						't' },
					      CLI_COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	int c, st, json = 0, rc, ret;
	const char *to = NULL;
	cli_location loc = { 0 }, dst = { 0 };

	while ((c = cli_getopt(argc, argv, ":t:jh", opts, help_restore, &json,
			       &st)) != -1) {
		switch (c) {
		case 't':
			to = optarg;
			break;
		case CLI_OPT_EXIT:
			return st;
		}
	}
	if ((rc = cli_operands(argc, 1, "missing LOCATION[@STEP]")))
		return rc;
	if (!to)
		return cli_usage("missing --to DEST");
	if ((rc = cli_parse_location(argv[optind], 1, &loc)))
		return rc;
	if ((rc = cli_parse_location(to, 0, &dst))) {
		cli_location_free(&loc);
		return rc;
	}
	ret = copy_step(&loc, &dst, json, "restore", NULL);
	cli_location_free(&loc);
	cli_location_free(&dst);
	return ret;
}

static int cmd_push(int argc, char **argv)
{
	static const struct option opts[] = { CLI_COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	int c, st, json = 0, rc, ret;
	cli_location loc = { 0 }, dst = { 0 };

	while ((c = cli_getopt(argc, argv, ":jh", opts, help_push, &json,
			       &st)) != -1) {
		if (c == CLI_OPT_EXIT)
			return st;
	}
	if (argc - optind < 2)
		return cli_usage("missing %s", argc - optind ?
						       "gs://BUCKET/PREFIX" :
						       "DIR[@STEP]");
	if (argc - optind > 2)
		return cli_usage("too many arguments");
	if ((rc = cli_parse_location(argv[optind], 1, &loc)))
		return rc;
	if ((rc = cli_parse_location(argv[optind + 1], 0, &dst))) {
		cli_location_free(&loc);
		return rc;
	}
	if (loc.kind != CLI_LOC_LOCAL || dst.kind != CLI_LOC_GCS) {
		ret = cli_usage("push takes a local DIR[@STEP] and a "
				"gs://BUCKET/PREFIX (or use restore)");
	} else {
		ret = copy_step(&loc, &dst, json, "push", NULL);
	}
	cli_location_free(&loc);
	cli_location_free(&dst);
	return ret;
}

CLI_DEFINE_COMMAND(restore, "copy a step, verified, to another location");
CLI_DEFINE_COMMAND(push, "upload a committed local step to gs://");
