/*
 * cmd_restore.c - ckptctl restore: copy a step, verified, to another directory.
 *
 * Design note: ckpt_reader_copy() copies and checks every file's size and
 * XXH3 and commits at the destination only when all matched; this file
 * refuses a copy onto the source itself (realpath) because that would
 * truncate what it reads.
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
	"Usage: ckptctl restore [OPTIONS] DIR[@STEP] --to OUTDIR\n"
	"\n"
	"Copy a step (default: the latest) into checkpoint root OUTDIR, checking\n"
	"every file's size and XXH3 while copying. The step is committed at the\n"
	"destination only if everything matched. OUTDIR must not be DIR itself.\n"
	"Ctrl-C cancels; nothing is committed then.\n"
	"\n"
	"Options:\n"
	"  -t, --to OUTDIR   destination root directory (required; created if\n"
	"                    needed)\n"
	"  -j, --json        machine-readable output\n"
	"  -h, --help        show this help\n"
	"\n"
	"Exit status: 0 copied and committed, 1 failure (nothing committed),\n"
	"2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl restore /mnt/backup/run1@1000 --to /ckpt/run1\n";

static int cmd_restore(int argc, char **argv)
{
	static const struct option opts[] = { { "to", required_argument, NULL,
						't' },
					      CLI_COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	int c, st, json = 0, rc, ret = 1;
	const char *to = NULL;
	cli_location loc = { 0 }, dst = { 0 };
	ckpt_reader *r = NULL;
	cli_progress p;
	size_t nf;
	uint64_t bytes, step;
	char label[64];

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
	if ((rc = cli_operands(argc, 1, "missing DIR[@STEP]")))
		return rc;
	if (!to)
		return cli_usage("missing --to OUTDIR");
	if ((rc = cli_parse_location(argv[optind], 1, &loc)))
		return rc;
	if ((rc = cli_parse_location(to, 0, &dst))) {
		cli_location_free(&loc);
		return rc;
	}
	if (cli_location_usable(&dst, 0))
		goto out;
	{
		/* Copying a step onto itself would truncate what it reads. */
		char *a = realpath(loc.path, NULL),
		     *b = realpath(dst.path, NULL);
		int same = a && b && strcmp(a, b) == 0;
		free(a);
		free(b);
		if (same) {
			cli_err("source and destination are the same directory");
			goto out;
		}
	}
	cli_install_signals();
	if (cli_open_reader(&loc, cli_location_step(&loc), &r))
		goto out;
	if ((rc = cli_mkdir_p(dst.path))) {
		cli_err("%s: %s", dst.path, strerror(-rc));
		goto out;
	}
	step = ckpt_reader_step(r);
	cli_files_total(r, &nf, &bytes);
	snprintf(label, sizeof(label), "restore step %" PRIu64, step);
	cli_progress_init(&p, label);
	rc = ckpt_reader_copy(r, dst.path, cli_progress_fn, &p);
	cli_progress_end(&p);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_reader_errmsg(r), rc));
		goto out;
	}
	if (json) {
		json_t *o = cli_jcheck(json_object());
		cli_jset(o, "step", cli_ju64(step));
		cli_jset(o, "source", cli_jstr(loc.path));
		cli_jset(o, "destination", cli_jstr(dst.path));
		cli_jset(o, "files", cli_ju64(nf));
		cli_jset(o, "bytes", cli_ju64(bytes));
		cli_jprint(o);
	} else {
		static char esc[CLI_ESC_MAX];
		printf("restored step %" PRIu64 " to %s: %zu files, %" PRIu64
		       " bytes verified\n",
		       step, st_escape(dst.path, esc, sizeof(esc)), nf, bytes);
	}
	ret = 0;
out:
	ckpt_reader_close(r);
	cli_location_free(&loc);
	cli_location_free(&dst);
	return ret;
}

CLI_DEFINE_COMMAND(restore, "copy a step, verified, to another directory");
