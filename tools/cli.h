/*
 * cli.h - shared helpers of the ckptctl commands (see cli.c).
 *
 * Design note: a command is one cmd_NAME.c file that defines a
 * `const struct cli_command cli_cmd_NAME` (name, entry point, one-line
 * summary for `ckptctl --help`, full help text) and is listed once in the
 * table in ckptctl.c. Its entry point gets argv starting at the command
 * name, parses its options with cli_getopt() and returns the exit status:
 *     0 success, 1 failure (message on stderr), CLI_EXIT_USAGE (2) usage.
 * Like the commands, this file uses only the public API (ckpt.h).
 */
#ifndef CKPTCTL_CLI_H
#define CKPTCTL_CLI_H

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ckpt.h"

#define CLI_EXIT_USAGE 2

/* An escaped name; the worst case is 4 output bytes per input byte. */
#define CLI_ESC_MAX (4 * CKPT_MAX_NAME + 8)

struct cli_command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary; /* one line for `ckptctl --help` */
	const char *help;    /* `ckptctl NAME --help` */
};

/* Defines cli_cmd_NAME from cmd_NAME() and help_NAME in a cmd_NAME.c. */
#define CLI_DEFINE_COMMAND(NAME, SUMMARY)                              \
	const struct cli_command cli_cmd_##NAME = { #NAME, cmd_##NAME, \
						    SUMMARY, help_##NAME }

/* The commands, one per cmd_NAME.c; listed in ckptctl.c. */
extern const struct cli_command cli_cmd_ls, cli_cmd_inspect, cli_cmd_verify,
	cli_cmd_restore, cli_cmd_export, cli_cmd_import, cli_cmd_gc,
	cli_cmd_push, cli_cmd_watch, cli_cmd_events, cli_cmd_run,
	cli_cmd_health, cli_cmd_recover;

/* Name of the running command, for "ckptctl: CMD: message"; set by main. */
extern const char *cli_cmd_name;
/* Sizes in bytes rather than KiB/MiB/GiB in tables (--bytes). */
extern int cli_bytes;
/* Set by SIGINT/SIGTERM; long operations then cancel cleanly. */
extern volatile sig_atomic_t cli_interrupted;

/* ---- Messages ---- */

/* "ckptctl: CMD: message" on stderr (stdout flushed first). */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same plus a hint to --help; returns CLI_EXIT_USAGE. */
int cli_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The library's message for a failure, falling back to the code's text. */
const char *cli_libmsg(const char *m, int rc);

/* ---- Locations ---- */

enum cli_loc_kind { CLI_LOC_LOCAL = 0, CLI_LOC_GCS = 1 };

/* Where a checkpoint lives: a root and optionally one step of it. */
typedef struct cli_location {
	enum cli_loc_kind kind;
	char *path; /* local directory, or "gs://bucket/prefix"; owned */
	int has_step;
	uint64_t step;
} cli_location;

/* ---- Options and arguments ---- */

/* Every command's options end with these entries and the NULL terminator;
 * its shortopts then include 'j' and 'h'. */
/* clang-format off */
#define CLI_COMMON_OPTS \
	{ "json", no_argument, NULL, 'j' }, { "help", no_argument, NULL, 'h' }
/* clang-format on */

/* -l/--location LOC and -H/--host N of the commands that journal what
 * they do (run, recover): the journal's location and the host index its
 * events carry. */
/* clang-format off */
#define CLI_JOURNAL_OPTS \
	{ "location", required_argument, NULL, 'l' }, \
	{ "host", required_argument, NULL, 'H' }
/* clang-format on */

/* cli_getopt() returned this: stop and return *status. */
#define CLI_OPT_EXIT (-2)

/*
 * getopt_long for a command whose shortopts start with ':' and include 'h'
 * (and 'j' when json is not NULL): -j/--json sets *json and is consumed;
 * returns the next other option character, -1 after the last option, or
 * CLI_OPT_EXIT with *status set to 0 after printing help to stdout or to
 * CLI_EXIT_USAGE after reporting an unknown option or a missing argument.
 */
int cli_getopt(int argc, char **argv, const char *shortopts,
	       const struct option *longopts, const char *help, int *json,
	       int *status);
/* getopt_long reported '?' or ':'; explain it as a usage error. */
int cli_bad_option(int c, char **argv);
/*
 * Checks that exactly `want` operands follow the options; otherwise prints
 * "too many arguments" or `missing` as a usage error. Returns 0 or
 * CLI_EXIT_USAGE.
 */
int cli_operands(int argc, int want, const char *missing);
/*
 * Options and operand of the commands that only display: -j/--json (sets
 * *json), -b/--bytes (sets cli_bytes), -h/--help, one DIR (DIR[@STEP] with
 * allow_step) parsed into *loc. Returns -1 to go on, else the exit status.
 */
int cli_display_args(int argc, char **argv, const char *help, int allow_step,
		     int *json, cli_location *loc);
/*
 * Takes option c if it is one of CLI_JOURNAL_OPTS, for a loop over
 * cli_getopt() to switch on: -l/--location's argument goes into
 * *location, -H/--host's into *host, and 0 is returned; a bad --host is
 * reported and CLI_OPT_EXIT returned with *status CLI_EXIT_USAGE; any
 * other c is returned as it is.
 */
int cli_journal_opt(int c, const char *arg, const char **location,
		    uint32_t *host, int *status);
/* --host N: a decimal below 2^32; 0 or CLI_EXIT_USAGE ("bad --host"). */
int cli_parse_host(const char *arg, uint32_t *host);
/* Strict unsigned decimal, optionally with K/M/G (KiB/MiB/GiB) suffix. */
int cli_parse_u64(const char *s, uint64_t *out, int allow_suffix);

/* "ROOT" or "ROOT@STEP"; 0 or CLI_EXIT_USAGE. Free with the next. */
int cli_parse_location(const char *arg, int allow_step, cli_location *l);
void cli_location_free(cli_location *l);
/* The named step, else CKPT_LATEST. */
uint64_t cli_location_step(const cli_location *l);
/* 0 if this build can use the location (and it is a directory when
 * must_exist); else prints why and returns -1. */
int cli_location_usable(const cli_location *l, int must_exist);
/* mkdir -p; 0 or -errno. */
int cli_mkdir_p(const char *path);

/* Open through the public API, printing the library's message on failure;
 * 0 or -1. cli_open_root opens without a staging pool (list, gc). */
int cli_open_root(const cli_location *l, ckpt **out);
int cli_open_reader(const cli_location *l, uint64_t step, ckpt_reader **out);
/* Number and total size of the files the step's commit record lists. */
void cli_files_total(const ckpt_reader *r, size_t *nfiles, uint64_t *bytes);
const char *cli_kind_name(int kind);
/* ckpt_reason_name, "unspecified" for a number this build does not know. */
const char *cli_reason_name(int reason);

/*
 * A handle that saves nothing, only to run the maintenance watcher with
 * options `o` (NULL: defaults): opened without a staging pool on a private
 * empty directory (what the library writes there, such as the journal of
 * the notices it sees, is removed with it by cli_watcher_close). Prints
 * the library's message on failure; 0 or -1.
 */
int cli_watcher_open(const ckpt_watch_opts *o, ckpt **out, char **tmpdir);
/* Closes the handle and removes its directory; accepts NULLs. */
void cli_watcher_close(ckpt *c, char *tmpdir);

/* ---- Formatting (into the caller's buffer, which is returned) ---- */

const char *cli_fmt_size(uint64_t v, char *buf, size_t len);
const char *cli_fmt_ratio(uint64_t raw, uint64_t stored, char *buf, size_t len);
const char *cli_fmt_time(int64_t ns, char *buf, size_t len);
/* CLOCK_REALTIME in ns. */
int64_t cli_now_ns(void);
/* RFC 3339 UTC with milliseconds (2026-12-03T08:00:01.123Z); "-" if 0. */
const char *cli_fmt_time_ms(int64_t ns, char *buf, size_t len);
const char *cli_fmt_shape(const uint64_t *shape, uint32_t ndim, char *buf,
			  size_t len);

/* ---- JSON; on allocation failure these print and exit(1) ---- */

json_t *cli_jcheck(json_t *v);
json_t *cli_ju64(uint64_t v);
/* Exact when s is valid UTF-8, else escaped. */
json_t *cli_jstr(const char *s);
json_t *cli_jratio(uint64_t raw, uint64_t stored);
json_t *cli_jshape(const uint64_t *shape, uint32_t ndim);
void cli_jset(json_t *o, const char *k, json_t *v);
void cli_jappend(json_t *a, json_t *v);
/* Prints v indented to stdout and releases it. */
void cli_jprint(json_t *v);

/* ---- Progress and cancellation ---- */

/* A single updating line on stderr when it is a terminal. */
typedef struct cli_progress {
	pthread_mutex_t mu;
	const char *label;
	int on;    /* stderr is a terminal */
	int shown; /* a progress line is on screen */
	double t0;
	double last;
} cli_progress;

void cli_progress_init(cli_progress *p, const char *label);
/* A ckpt_progress_fn (arg is the cli_progress); returns 1 to cancel once
 * SIGINT/SIGTERM arrived. Thread-safe. */
int cli_progress_fn(void *arg, uint64_t done, uint64_t total);
/* Clears the line and releases p. */
void cli_progress_end(cli_progress *p);
/* The first SIGINT/SIGTERM sets cli_interrupted; a second one kills. */
void cli_install_signals(void);

#endif
