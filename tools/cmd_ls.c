/*
 * cmd_ls.c - ckptctl ls: list the committed steps of a checkpoint directory.
 *
 * Design note: one ckpt_list() on a handle opened without a staging pool,
 * then a table or JSON; the latest step is asked for separately so that a
 * root with no committed step still lists (empty) instead of failing.
 * For a directory, ckpt_upload_list() adds which steps are not yet in the
 * remote location (uploading, failed, pending) and how far they got: an
 * UPLOAD column, shown only when some upload is unfinished.
 */
#include <inttypes.h>
#include <stdio.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"

static const char *upload_state_name(int32_t st)
{
	switch (st) {
	case CKPT_UPLOAD_RUNNING:
		return "uploading";
	case CKPT_UPLOAD_FAILED:
		return "failed";
	case CKPT_UPLOAD_PENDING:
		return "pending";
	default:
		return "unknown";
	}
}

static const ckpt_upload_step *upload_of(const ckpt_upload_step *up, size_t n,
					 uint64_t step)
{
	for (size_t i = 0; i < n; i++)
		if (up[i].step == step)
			return &up[i];
	return NULL;
}

/* "uploading 1.5 MiB/12.0 MiB" (total "?" while the save runs) */
static const char *upload_cell(const ckpt_upload_step *u, char *buf, size_t len)
{
	char a[32], b[32];

	if (!u)
		return "-";
	snprintf(buf, len, "%s %s/%s", upload_state_name(u->state),
		 cli_fmt_size(u->bytes_confirmed, a, sizeof(a)),
		 u->sizes_known ? cli_fmt_size(u->bytes_total, b, sizeof(b)) :
				  "?");
	return buf;
}

static json_t *upload_json(const ckpt_upload_step *u)
{
	json_t *o;

	if (!u)
		return json_null();
	o = cli_jcheck(json_object());
	cli_jset(o, "state", cli_jstr(upload_state_name(u->state)));
	cli_jset(o, "remote", cli_jstr(u->remote));
	cli_jset(o, "bytes_confirmed", cli_ju64(u->bytes_confirmed));
	cli_jset(o, "bytes_total",
		 u->sizes_known ? cli_ju64(u->bytes_total) : json_null());
	cli_jset(o, "error", u->msg[0] ? cli_jstr(u->msg) : json_null());
	return o;
}
#include "safetensors.h"

static const char help_ls[] =
	"Usage: ckptctl ls [OPTIONS] DIR\n"
	"\n"
	"List the committed steps of checkpoint root DIR, oldest first: step,\n"
	"hosts, tensors, raw size, stored size (all files), ratio and commit time\n"
	"(UTC). The latest step is marked with '*'. DIR is taken whole: an '@' in\n"
	"it never names a step. For a directory saved with a remote location,\n"
	"steps not yet in the bucket get an UPLOAD column: uploading (a process\n"
	"has DIR open with its remote), failed (with why), or pending (resumed\n"
	"by the next open with the remote), and bytes confirmed / total.\n"
	"\n"
	"Options:\n"
	"  -j, --json    machine-readable output (exact byte counts)\n"
	"  -b, --bytes   print sizes in bytes\n"
	"  -h, --help    show this help\n"
	"\n"
	"Exit status: 0 listed (also when no step is committed), 1 failure\n"
	"(e.g. DIR missing), 2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl ls /ckpt/run1\n"
	"  ckptctl ls --json /ckpt/run1\n";

static int cmd_ls(int argc, char **argv)
{
	int json = 0, rc, ret = 1, have_latest;
	cli_location loc = { 0 };
	ckpt *h = NULL;
	ckpt_step_info *steps = NULL;
	ckpt_upload_step *up = NULL;
	size_t n = 0, nup = 0;
	uint64_t latest = 0;

	rc = cli_display_args(argc, argv, help_ls, 0, &json, &loc);
	if (rc >= 0)
		return rc;
	if (cli_open_root(&loc, &h))
		goto out;
	rc = ckpt_list(h, &steps, &n);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(h), rc));
		goto out;
	}
	rc = ckpt_latest(h, &latest);
	if (rc && rc != CKPT_E_NOTFOUND) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(h), rc));
		goto out;
	}
	have_latest = rc == 0;
	if (loc.kind != CLI_LOC_GCS) {
		rc = ckpt_upload_list(loc.path, &up, &nup);
		if (rc) {
			cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
			goto out;
		}
	}

	if (json) {
		json_t *root = cli_jcheck(json_object()),
		       *arr = cli_jcheck(json_array());
		cli_jset(root, "root", cli_jstr(loc.path));
		cli_jset(root, "latest",
			 have_latest ? cli_ju64(latest) : json_null());
		for (size_t i = 0; i < n; i++) {
			const ckpt_step_info *s = &steps[i];
			json_t *o = cli_jcheck(json_object());
			char t[64];
			cli_jset(o, "step", cli_ju64(s->step));
			cli_jset(o, "hosts", cli_ju64(s->host_count));
			cli_jset(o, "files", cli_ju64(s->file_count));
			cli_jset(o, "tensors", cli_ju64(s->tensor_count));
			cli_jset(o, "raw_bytes", cli_ju64(s->raw_bytes));
			cli_jset(o, "stored_bytes", cli_ju64(s->stored_bytes));
			cli_jset(o, "ratio",
				 cli_jratio(s->raw_bytes, s->stored_bytes));
			cli_jset(o, "commit_unix_ns",
				 cli_jcheck(json_integer(s->commit_unix_ns)));
			cli_jset(o, "time",
				 cli_jstr(cli_fmt_time(s->commit_unix_ns, t,
						       sizeof(t))));
			cli_jset(o, "reason",
				 cli_jstr(cli_reason_name(s->reason)));
			if (s->referenced_by)
				cli_jset(o, "referenced_by",
					 cli_ju64(s->referenced_by));
			cli_jset(o, "latest",
				 json_boolean(have_latest &&
					      s->step == latest));
			cli_jset(o, "upload",
				 upload_json(upload_of(up, nup, s->step)));
			cli_jappend(arr, o);
		}
		cli_jset(root, "steps", arr);
		/* every unfinished upload, committed locally or not (yet) */
		arr = cli_jcheck(json_array());
		for (size_t i = 0; i < nup; i++) {
			json_t *o = upload_json(&up[i]);

			cli_jset(o, "step", cli_ju64(up[i].step));
			cli_jappend(arr, o);
		}
		cli_jset(root, "uploads", arr);
		cli_jprint(root);
	} else if (n == 0) {
		printf("no committed steps in %s\n", loc.path);
	} else {
		printf("%-22s %5s %8s %11s %11s %8s  %-20s  %-*s%s\n", "STEP",
		       "HOSTS", "TENSORS", "RAW", "STORED", "RATIO",
		       "TIME (UTC)", nup ? 11 : 0, "REASON",
		       nup ? "  UPLOAD" : "");
		for (size_t i = 0; i < n; i++) {
			const ckpt_step_info *s = &steps[i];
			char st[32], a[32], b[32], r[32], t[64], u[96];
			snprintf(st, sizeof(st), "%" PRIu64 "%s", s->step,
				 have_latest && s->step == latest ? " *" : "");
			printf("%-22s %5u %8" PRIu64
			       " %11s %11s %8s  %-20s  %-*s%s%s",
			       st, s->host_count, s->tensor_count,
			       cli_fmt_size(s->raw_bytes, a, sizeof(a)),
			       cli_fmt_size(s->stored_bytes, b, sizeof(b)),
			       cli_fmt_ratio(s->raw_bytes, s->stored_bytes, r,
					     sizeof(r)),
			       cli_fmt_time(s->commit_unix_ns, t, sizeof(t)),
			       nup ? 11 : 0, cli_reason_name(s->reason),
			       nup ? "  " : "",
			       nup ? upload_cell(upload_of(up, nup, s->step), u,
						 sizeof(u)) :
				     "");
			if (s->referenced_by) /* dedup: SPEC.md section 16 */
				printf("  kept: referenced by %" PRIu64,
				       s->referenced_by);
			printf("\n");
		}
		printf("%zu committed step%s; * = latest\n", n,
		       n == 1 ? "" : "s");
	}
	if (!json && nup) {
		printf("%zu step%s not yet in %s\n", nup, nup == 1 ? "" : "s",
		       up[0].remote);
		for (size_t i = 0; i < nup; i++)
			if (up[i].msg[0])
				printf("step %" PRIu64 ": upload failed: %s\n",
				       up[i].step, up[i].msg);
	}
	ret = 0;
out:
	ckpt_free(up);
	ckpt_free(steps);
	ckpt_close(h);
	cli_location_free(&loc);
	return ret;
}

CLI_DEFINE_COMMAND(ls, "list the committed steps of a checkpoint directory");
