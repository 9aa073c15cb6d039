/*
 * cmd_verify.c - ckptctl verify: check every file and chunk of a step against its checksums.
 *
 * Design note: ckpt_reader_verify() does the checking; this file adds
 * the progress line, cancellation, --all (one reader per committed step,
 * failures counted, not fatal) and the report. The first bad place is the
 * library's message, which names the file and offset.
 */
#include <inttypes.h>
#include <stdio.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"

static const char help_verify[] =
	"Usage: ckptctl verify [OPTIONS] DIR[@STEP]\n"
	"       ckptctl verify --all [OPTIONS] DIR\n"
	"\n"
	"Check a step (default: the latest) against its commit record: every\n"
	"file's size and XXH3, every shard and chunk header, every chunk's\n"
	"content hash. Prints 'OK step N: X files, Y bytes verified' or names the\n"
	"first bad place. Ctrl-C cancels (exit 1).\n"
	"\n"
	"Options:\n"
	"  -a, --all     verify every committed step (DIR must not name a step)\n"
	"  -j, --json    machine-readable output\n"
	"  -h, --help    show this help\n"
	"\n"
	"Exit status: 0 intact, 1 a check failed, the step cannot be read or\n"
	"the run was cancelled (with --all: any of these for any step, or no\n"
	"step is committed), 2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl verify /ckpt/run1\n"
	"  ckptctl verify /ckpt/run1@1000\n"
	"  ckptctl verify --all --json /ckpt/run1\n";

/* Verifies one step; fills a JSON result when res != NULL. 0 = OK. */
static int verify_one(const cli_location *loc, uint64_t step, json_t *res,
		      int quiet_ok)
{
	ckpt_reader *r = NULL;
	cli_progress p;
	size_t nf = 0;
	uint64_t bytes = 0;
	int rc;
	char label[64];

	if (cli_location_usable(loc, 1))
		return -1;
	rc = ckpt_reader_open(&r, loc->path, step, NULL);
	if (rc) {
		const char *m = cli_libmsg(ckpt_reader_errmsg(NULL), rc);
		if (res) {
			if (step != CKPT_LATEST)
				cli_jset(res, "step", cli_ju64(step));
			cli_jset(res, "ok", json_false());
			cli_jset(res, "error", cli_jstr(m));
		}
		cli_err("%s", m);
		return -1;
	}
	step = ckpt_reader_step(r);
	cli_files_total(r, &nf, &bytes);
	snprintf(label, sizeof(label), "verify step %" PRIu64, step);
	cli_progress_init(&p, label);
	rc = ckpt_reader_verify(r, cli_progress_fn, &p);
	cli_progress_end(&p);
	if (res) {
		cli_jset(res, "step", cli_ju64(step));
		cli_jset(res, "ok", json_boolean(rc == 0));
		cli_jset(res, "files", cli_ju64(nf));
		cli_jset(res, "bytes", cli_ju64(bytes));
		if (rc)
			cli_jset(res, "error",
				 cli_jstr(cli_libmsg(ckpt_reader_errmsg(r),
						     rc)));
	}
	if (rc)
		cli_err("%s", cli_libmsg(ckpt_reader_errmsg(r), rc));
	else if (!quiet_ok)
		printf("OK step %" PRIu64 ": %zu files, %" PRIu64
		       " bytes verified\n",
		       step, nf, bytes);
	ckpt_reader_close(r);
	return rc ? -1 : 0;
}

static int cmd_verify(int argc, char **argv)
{
	static const struct option opts[] = { { "all", no_argument, NULL, 'a' },
					      CLI_COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	int c, st, json = 0, all = 0, rc, ret = 1;
	cli_location loc = { 0 };

	while ((c = cli_getopt(argc, argv, ":jah", opts, help_verify, &json,
			       &st)) != -1) {
		switch (c) {
		case 'a':
			all = 1;
			break;
		case CLI_OPT_EXIT:
			return st;
		}
	}
	if ((rc = cli_operands(argc, 1, "missing DIR[@STEP]")))
		return rc;
	if ((rc = cli_parse_location(argv[optind], 1, &loc)))
		return rc;
	if (all && loc.has_step) {
		cli_location_free(&loc);
		return cli_usage("--all verifies every step; do not name one");
	}
	cli_install_signals();

	if (!all) {
		json_t *res = json ? cli_jcheck(json_object()) : NULL;
		ret = verify_one(&loc, cli_location_step(&loc), res, json) ? 1 :
									     0;
		if (res)
			cli_jprint(res);
	} else {
		ckpt *h = NULL;
		ckpt_step_info *steps = NULL;
		size_t n = 0, bad = 0, checked;
		int ok;
		json_t *root = NULL, *arr = NULL;

		if (cli_open_root(&loc, &h))
			goto out;
		rc = ckpt_list(h, &steps, &n);
		if (rc) {
			cli_err("%s", cli_libmsg(ckpt_errmsg(h), rc));
			ckpt_close(h);
			goto out;
		}
		ckpt_close(h);
		if (json) {
			root = cli_jcheck(json_object());
			arr = cli_jcheck(json_array());
		}
		for (checked = 0; checked < n && !cli_interrupted; checked++) {
			json_t *res = json ? cli_jcheck(json_object()) : NULL;
			if (verify_one(&loc, steps[checked].step, res, json))
				bad++;
			if (res)
				cli_jappend(arr, res);
		}
		/* Interrupted between two steps: the rest was not checked. */
		if (checked < n)
			cli_err("interrupted after %zu of %zu steps", checked,
				n);
		ok = bad == 0 && n > 0 && checked == n;
		if (json) {
			cli_jset(root, "ok", json_boolean(ok));
			cli_jset(root, "steps_verified", cli_ju64(checked));
			cli_jset(root, "steps_failed", cli_ju64(bad));
			cli_jset(root, "results", arr);
			cli_jprint(root);
		} else if (n > 0) {
			printf("%zu of %zu steps OK\n", checked - bad, n);
		}
		if (n == 0)
			cli_err("%s: no committed steps", loc.path);
		ckpt_free(steps);
		ret = ok ? 0 : 1;
	}
out:
	cli_location_free(&loc);
	return ret;
}

CLI_DEFINE_COMMAND(
	verify, "check every file and chunk of a step against its checksums");
