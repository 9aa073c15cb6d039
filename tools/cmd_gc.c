/*
 * cmd_gc.c - ckptctl gc: remove old steps and debris by a retention policy.
 *
 * Design note: the policy and the removal are the library's (ckpt_gc);
 * this file prints each removal as the callback reports it, or collects
 * them for --json, where the kept steps are the listing taken before gc
 * minus the removed ones.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"

static const char help_gc[] =
	"Usage: ckptctl gc [OPTIONS] DIR --keep N\n"
	"\n"
	"Remove committed steps outside the retention policy, uncommitted debris\n"
	"older than the newest committed step and stray temporary files in DIR.\n"
	"Kept: the newest N steps (0 = all), every step divisible by K\n"
	"(--keep-every) and always the newest step. DIR is taken whole: an '@' in\n"
	"it never names a step.\n"
	"\n"
	"Options:\n"
	"  -k, --keep N          keep the newest N committed steps (required)\n"
	"  -e, --keep-every K    also keep steps divisible by K (0 = none, the\n"
	"                        default)\n"
	"  -n, --dry-run         report what would be removed, remove nothing\n"
	"  -j, --json            machine-readable output\n"
	"  -h, --help            show this help\n"
	"\n"
	"Exit status: 0 done, 1 failure (e.g. DIR missing, a removal failed),\n"
	"2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl gc /ckpt/run1 --keep 3\n"
	"  ckptctl gc /ckpt/run1 --keep 2 --keep-every 1000 --dry-run\n";

/* What ckpt_gc reports step by step: printed as it comes, or collected
 * for --json. */
typedef struct gc_out {
	int json, dry;
	json_t *removed; /* committed steps removed by retention */
	json_t *debris;  /* uncommitted step directories removed */
} gc_out;

static void gc_step(void *arg, uint64_t step, int committed, uint64_t bytes)
{
	gc_out *o = arg;

	(void)bytes;
	if (o->json) {
		cli_jappend(committed ? o->removed : o->debris, cli_ju64(step));
		return;
	}
	printf("%s %sstep %" PRIu64 "\n", o->dry ? "would remove" : "removed",
	       committed ? "" : "uncommitted ", step);
	fflush(stdout);
}

static int cmd_gc(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "keep", required_argument, NULL, 'k' },
		{ "keep-every", required_argument, NULL, 'e' },
		{ "dry-run", no_argument, NULL, 'n' },
		CLI_COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	int c, st, json = 0, dry = 0, have_keep = 0, rc, ret = 1;
	uint64_t keep = 0, every = 0;
	cli_location loc = { 0 };
	ckpt *h = NULL;
	ckpt_step_info *before = NULL;
	size_t nb = 0;
	ckpt_gc_report rep;
	gc_out go = { 0 };

	while ((c = cli_getopt(argc, argv, ":k:e:njh", opts, help_gc, &json,
			       &st)) != -1) {
		switch (c) {
		case 'k':
			if (cli_parse_u64(optarg, &keep, 0) ||
			    keep > UINT32_MAX)
				return cli_usage("bad --keep '%s'", optarg);
			have_keep = 1;
			break;
		case 'e':
			if (cli_parse_u64(optarg, &every, 0) ||
			    every > UINT32_MAX)
				return cli_usage("bad --keep-every '%s'",
						 optarg);
			break;
		case 'n':
			dry = 1;
			break;
		case CLI_OPT_EXIT:
			return st;
		}
	}
	if ((rc = cli_operands(argc, 1, "missing DIR")))
		return rc;
	if (!have_keep)
		return cli_usage("missing --keep N");
	if ((rc = cli_parse_location(argv[optind], 0, &loc)))
		return rc;
	if (cli_open_root(&loc, &h))
		goto out;
	go.json = json;
	go.dry = dry;
	if (json) {
		/* only to name the kept steps */
		rc = ckpt_list(h, &before, &nb);
		if (rc) {
			cli_err("%s", cli_libmsg(ckpt_errmsg(h), rc));
			goto out;
		}
		go.removed = cli_jcheck(json_array());
		go.debris = cli_jcheck(json_array());
	}
	memset(&rep, 0, sizeof(rep));
	rc = ckpt_gc(h, (uint32_t)keep, (uint32_t)every,
		     dry ? CKPT_GC_DRY_RUN : 0, gc_step, &go, &rep);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(h), rc));
		goto out;
	}
	if (json) {
		json_t *o = cli_jcheck(json_object()),
		       *kept = cli_jcheck(json_array());

		for (size_t i = 0; i < nb; i++) {
			json_t *sv = cli_ju64(before[i].step);
			int gone = 0;

			for (size_t k = 0; k < json_array_size(go.removed); k++)
				if (json_equal(sv,
					       json_array_get(go.removed, k)))
					gone = 1;
			if (gone)
				json_decref(sv);
			else
				cli_jappend(kept, sv);
		}
		cli_jset(o, "dry_run", json_boolean(dry));
		cli_jset(o, "removed_steps", json_incref(go.removed));
		cli_jset(o, "removed_debris_steps", json_incref(go.debris));
		cli_jset(o, "kept_steps", kept);
		cli_jset(o, "steps_removed", cli_ju64(rep.steps_removed));
		cli_jset(o, "debris_removed", cli_ju64(rep.debris_removed));
		cli_jset(o, "bytes_freed", cli_ju64(rep.bytes_freed));
		cli_jprint(o);
	} else {
		char a[32];
		printf("%s%" PRIu64 " step%s, %" PRIu64
		       " debris item%s, %s %s\n",
		       dry ? "dry run: would remove " : "removed ",
		       rep.steps_removed, rep.steps_removed == 1 ? "" : "s",
		       rep.debris_removed, rep.debris_removed == 1 ? "" : "s",
		       cli_fmt_size(rep.bytes_freed, a, sizeof(a)),
		       dry ? "would be freed" : "freed");
	}
	ret = 0;
out:
	json_decref(go.removed);
	json_decref(go.debris);
	ckpt_free(before);
	ckpt_close(h);
	cli_location_free(&loc);
	return ret;
}

CLI_DEFINE_COMMAND(gc, "remove old steps and debris by a retention policy");
